//! The manual cannot drift from the code:
//! - `docs/configuration.md` has one row per setting the code reads, with its default and its
//!   `SVCGATE_<SECTION>_<KEY>` variable, and no row for a setting that does not exist;
//! - the webhook signature test vector in `docs/webhooks.md` is what the signing code makes,
//!   and the Rust verify recipe there is the one compiled and run here.
//!
//! Setting names come from the configuration types themselves: serde tells a deserializer the
//! fields of every struct it reads, so a deserializer that records them, and walks one field at
//! a time, finds every key — those whose default is `None` and so are missing from a serialized
//! default included.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use svcgate::config::Config;

const CONFIGURATION: &str = include_str!("../docs/configuration.md");
const WEBHOOKS: &str = include_str!("../docs/webhooks.md");

/// What the walk learned about one path (`["store", "url"]`).
#[derive(Debug, Default, Clone)]
struct Shape {
    /// The struct's fields, when the value at the path is a struct.
    fields: Option<Vec<&'static str>>,
    /// Whether the value at the path is a sequence.
    seq: bool,
}

type Shapes = Rc<RefCell<BTreeMap<Vec<String>, Shape>>>;

/// A deserializer that records the shape of what is asked of it at `at`, and goes deeper only
/// along `path`: one field of a struct, or one element of a sequence (`"[]"`). Everything else
/// reads as empty, so structs take their defaults and leaves fail (which ends that walk: what it
/// recorded on the way stays).
struct Recorder {
    path: Rc<Vec<String>>,
    at: Vec<String>,
    shapes: Shapes,
}

impl Recorder {
    fn deeper(&self, step: &str) -> Recorder {
        let mut at = self.at.clone();
        at.push(step.to_string());
        Recorder {
            path: self.path.clone(),
            at,
            shapes: self.shapes.clone(),
        }
    }

    fn next_step(&self) -> Option<&String> {
        self.path.get(self.at.len())
    }
}

impl<'de> Deserializer<'de> for Recorder {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("a leaf"))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_some(self)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.shapes
            .borrow_mut()
            .entry(self.at.clone())
            .or_default()
            .fields = Some(fields.to_vec());
        let field = self
            .next_step()
            .and_then(|step| fields.iter().find(|f| *f == step).copied());
        visitor.visit_map(OneField {
            field,
            recorder: Some(self),
        })
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.shapes
            .borrow_mut()
            .entry(self.at.clone())
            .or_default()
            .seq = true;
        let element = self.next_step().is_some_and(|s| s == "[]");
        visitor.visit_seq(OneElement {
            recorder: element.then_some(self),
        })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct newtype_struct tuple tuple_struct map enum identifier ignored_any
    }
}

struct OneField {
    field: Option<&'static str>,
    recorder: Option<Recorder>,
}

impl<'de> MapAccess<'de> for OneField {
    type Error = de::value::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        match self.field {
            Some(field) if self.recorder.is_some() => seed
                .deserialize(de::value::BorrowedStrDeserializer::new(field))
                .map(Some),
            _ => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        let recorder = self
            .recorder
            .take()
            .ok_or_else(|| <Self::Error as de::Error>::custom("one value only"))?;
        let field = self.field.unwrap_or_default();
        seed.deserialize(recorder.deeper(field))
    }
}

struct OneElement {
    recorder: Option<Recorder>,
}

impl<'de> SeqAccess<'de> for OneElement {
    type Error = de::value::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        match self.recorder.take() {
            Some(recorder) => {
                let element = recorder.deeper("[]");
                seed.deserialize(element).map(Some)
            }
            None => Ok(None),
        }
    }
}

/// Walks `Config` along `path`, adding what it sees to `shapes`.
fn walk(path: &[&str], shapes: &Shapes) {
    let recorder = Recorder {
        path: Rc::new(path.iter().map(|s| s.to_string()).collect()),
        at: Vec::new(),
        shapes: shapes.clone(),
    };
    // A walk ends in an error wherever it meets a leaf or a required field: what it recorded on
    // the way is what is wanted.
    let _ = <Config as serde::Deserialize>::deserialize(recorder);
}

/// Every setting as the code declares it.
struct Settings {
    /// `section.key` of every setting in a `[section]`.
    keys: BTreeSet<String>,
    /// `section.key` of a list of tables → its fields (`metering.project_budgets`), and
    /// top-level lists of tables (`routes`) under their own name.
    table_lists: BTreeMap<String, Vec<&'static str>>,
}

fn settings() -> Settings {
    let shapes: Shapes = Rc::default();
    walk(&[], &shapes);
    let sections = shapes.borrow()[&Vec::new()]
        .fields
        .clone()
        .expect("Config is a struct");
    let mut keys = BTreeSet::new();
    let mut table_lists = BTreeMap::new();
    for section in sections.iter().copied() {
        walk(&[section], &shapes);
        walk(&[section, "[]"], &shapes);
        let shape = shapes.borrow()[&vec![section.to_string()]].clone();
        if shape.seq {
            let element = vec![section.to_string(), "[]".to_string()];
            let fields = shapes.borrow().get(&element).and_then(|s| s.fields.clone());
            let fields = fields.unwrap_or_else(|| panic!("{section}: a list of what?"));
            table_lists.insert(section.to_string(), fields);
            continue;
        }
        let fields = shape
            .fields
            .unwrap_or_else(|| panic!("{section} is neither a table nor a list of tables"));
        for key in fields {
            walk(&[section, key, "[]"], &shapes);
            let path = vec![section.to_string(), key.to_string()];
            let element = vec![section.to_string(), key.to_string(), "[]".to_string()];
            let element_fields = shapes.borrow().get(&element).and_then(|s| s.fields.clone());
            let is_seq = shapes.borrow().get(&path).is_some_and(|s| s.seq);
            if let (true, Some(fields)) = (is_seq, element_fields) {
                table_lists.insert(format!("{section}.{key}"), fields);
            }
            keys.insert(format!("{section}.{key}"));
        }
    }
    Settings { keys, table_lists }
}

/// The rows of every table in `markdown` whose header is `header`, as cells without their
/// surrounding spaces.
fn table_rows(markdown: &str, header: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in markdown.lines() {
        let line = line.trim();
        if line == header {
            in_table = true;
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if in_table && !line.starts_with("|---") {
            rows.push(
                line.trim_matches('|')
                    .split(" | ")
                    .map(|c| c.trim().to_string())
                    .collect(),
            );
        }
    }
    rows
}

fn unquote(cell: &str) -> &str {
    cell.strip_prefix('`')
        .and_then(|c| c.strip_suffix('`'))
        .unwrap_or(cell)
}

/// Every default, as the TOML the configuration file would hold.
fn defaults() -> toml::Table {
    match toml::Value::try_from(Config::default()) {
        Ok(toml::Value::Table(t)) => t,
        other => panic!("defaults do not serialize to a table: {other:?}"),
    }
}

/// The default of `section.key` as a TOML value, or `None` when it has none.
fn default_of(defaults: &toml::Table, key: &str) -> Option<String> {
    let (section, key) = key.split_once('.')?;
    let value = defaults.get(section)?.as_table()?.get(key)?;
    Some(value.to_string())
}

#[test]
fn the_configuration_reference_has_one_row_per_setting() {
    let settings = settings();
    assert!(
        settings.keys.len() > 40,
        "the walk found only {:?}",
        settings.keys
    );
    let defaults = defaults();
    let rows = table_rows(CONFIGURATION, "| key | default | environment | meaning |");
    let mut documented = BTreeSet::new();
    let mut problems = Vec::new();
    for row in &rows {
        let [key, default, env, meaning] = row.as_slice() else {
            problems.push(format!("not four cells: {row:?}"));
            continue;
        };
        let key = unquote(key);
        if !documented.insert(key.to_string()) {
            problems.push(format!("{key}: two rows"));
        }
        if !settings.keys.contains(key) {
            problems.push(format!("{key}: documented, but there is no such setting"));
            continue;
        }
        let expected_env = format!("SVCGATE_{}", key.replace('.', "_").to_ascii_uppercase());
        if unquote(env) != expected_env {
            problems.push(format!(
                "{key}: environment {env}, expected `{expected_env}`"
            ));
        }
        match default_of(&defaults, key) {
            Some(value) if unquote(default) != value || !default.starts_with('`') => {
                problems.push(format!("{key}: default {default}, expected `{value}`"))
            }
            None if default != "none" => {
                problems.push(format!("{key}: default {default}, expected none (unset)"))
            }
            _ => {}
        }
        if meaning.is_empty() {
            problems.push(format!("{key}: no meaning"));
        }
    }
    for key in settings.keys.difference(&documented) {
        problems.push(format!(
            "{key}: a setting with no row in docs/configuration.md"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_documented_variable_is_accepted_by_the_loader() {
    let settings = settings();
    let defaults = defaults();
    for key in &settings.keys {
        let env = format!("SVCGATE_{}", key.replace('.', "_").to_ascii_uppercase());
        // The default, as the variable would give it (strings bare), or empty: unset.
        let value = match default_of(&defaults, key) {
            Some(v) if v.starts_with('"') => v.trim_matches('"').to_string(),
            Some(v) => v,
            None => String::new(),
        };
        let loaded = Config::load(None, [(env.clone(), value.clone())]);
        assert!(loaded.is_ok(), "{env}={value}: {:?}", loaded.err());
    }
}

#[test]
fn lists_of_tables_have_their_fields_documented() {
    let settings = settings();
    assert!(
        settings.table_lists.contains_key("routes"),
        "{:?}",
        settings.table_lists
    );
    let rows = table_rows(CONFIGURATION, "| field | required | meaning |");
    let documented: BTreeSet<String> = rows.iter().map(|r| unquote(&r[0]).to_string()).collect();
    let expected: BTreeSet<String> = settings
        .table_lists
        .iter()
        .flat_map(|(list, fields)| fields.iter().map(move |f| format!("{list}.{f}")))
        .collect();
    assert_eq!(documented, expected);
}

#[test]
fn the_webhook_test_vector_is_what_the_signing_code_makes() {
    let cell = |name: &str| -> String {
        let row = WEBHOOKS
            .lines()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .unwrap_or_else(|| panic!("no test vector row {name}"));
        let value = row.trim_end_matches('|').rsplit(" | ").next().unwrap_or("");
        unquote(value.trim()).to_string()
    };
    let secret = cell("secret");
    let timestamp: u64 = cell("`Service-Timestamp`").parse().expect("a timestamp");
    let body = cell("body");
    let signature = cell("`Service-Signature`");
    assert_eq!(
        svcgate::webhooks::sign(&secret, timestamp, body.as_bytes()),
        signature
    );
    assert_eq!(
        recipe::verify(
            &secret,
            "1700000000",
            &signature,
            body.as_bytes(),
            timestamp
        ),
        "ok"
    );
    let t = &timestamp.to_string();
    assert_eq!(
        recipe::verify(&secret, t, &signature, body.as_bytes(), timestamp + 301),
        "stale"
    );
    assert_eq!(
        recipe::verify("whsec_other", t, &signature, body.as_bytes(), timestamp),
        "bad signature"
    );
    assert_eq!(
        recipe::verify(&secret, t, "zz", body.as_bytes(), timestamp),
        "bad signature"
    );
    // During a rotation: either listed signature.
    let other = svcgate::webhooks::sign("whsec_other", timestamp, body.as_bytes());
    for listed in [
        format!("{other},{signature}"),
        format!("{signature},{other}"),
    ] {
        assert_eq!(
            recipe::verify(&secret, t, &listed, body.as_bytes(), timestamp),
            "ok"
        );
    }
}

#[test]
fn the_rust_verify_recipe_is_the_one_tested_here() {
    let this = include_str!("docs.rs");
    let start = this.find("// recipe:start\n").expect("start marker") + "// recipe:start\n".len();
    let end = start + this[start..].find("    // recipe:end").expect("end marker");
    let tested: String = this[start..end]
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let documented = WEBHOOKS
        .split("```rust\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a rust block in docs/webhooks.md");
    assert_eq!(documented.trim(), tested.trim());
}

mod recipe {
    // recipe:start
    use hmac::{Hmac, Mac};
    use sha2::Sha256;
    use subtle::ConstantTimeEq;

    const TOLERANCE: u64 = 300;

    /// "ok", "stale" (answer 400) or "bad signature" (answer 401). `timestamp` and `signature`
    /// are the `Service-Timestamp` and `Service-Signature` header values; `body` is the raw body.
    /// Any one listed signature that matches is enough.
    pub fn verify(
        secret: &str,
        timestamp: &str,
        signature: &str,
        body: &[u8],
        now: u64,
    ) -> &'static str {
        let Ok(timestamp) = timestamp.trim().parse::<u64>() else {
            return "bad signature";
        };
        if timestamp.abs_diff(now) > TOLERANCE {
            return "stale";
        }
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.as_bytes()) else {
            return "bad signature";
        };
        mac.update(format!("{timestamp}.").as_bytes());
        mac.update(body);
        let expected: [u8; 32] = mac.finalize().into_bytes().into();
        // During a secret rotation the header lists two signatures, comma-separated.
        let matches = signature.split(',').any(|presented| {
            let mut bytes = [0u8; 32];
            hex::decode_to_slice(presented.trim(), &mut bytes).is_ok()
                && bool::from(expected.ct_eq(&bytes))
        });
        if matches {
            "ok"
        } else {
            "bad signature"
        }
    }
    // recipe:end
}
