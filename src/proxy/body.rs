//! Reading request bodies the gateway answers itself (bounded, so a huge body costs nothing).

use compact_str::CompactString;
use pingora::proxy::Session;

/// Reads the whole request body if it is at most `limit` bytes. A larger body is left unread
/// (`None`) and the connection is marked to close instead of being drained.
pub async fn read_bounded(session: &mut Session, limit: usize) -> pingora::Result<Option<Vec<u8>>> {
    let mut body = Vec::new();
    while let Some(chunk) = session.read_request_body().await? {
        if body.len() + chunk.len() > limit {
            session.set_keepalive(None);
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// How much of a forwarded request body is kept to find its `model`.
pub const SNIFF_LIMIT: usize = 16 * 1024;

/// The top-level `model` of a JSON body, from its first [`SNIFF_LIMIT`] bytes, at most 256
/// characters of it. A complete body is parsed as far as its top-level `model` and no further;
/// a longer one is scanned for the first `"model": "…"`.
pub fn sniff_model(prefix: &[u8], complete: bool) -> Option<CompactString> {
    if complete {
        // Most clients send `model` first: `{"model": "…"` is read directly, without a
        // deserializer (which, stopped at `model`, also builds an error for the rest).
        let first = trim_start(trim_start(prefix).strip_prefix(b"{")?);
        if let Some(model) = first.strip_prefix(MODEL).and_then(plain_string_value) {
            return Some(CompactString::from(model));
        }
        return top_level_model(prefix).map(|model| truncate_chars(model, MODEL_CHARS));
    }
    let start = prefix.windows(MODEL.len()).position(|w| w == MODEL)? + MODEL.len();
    plain_string_value(&prefix[start..]).map(CompactString::from)
}

const MODEL: &[u8] = b"\"model\"";

/// The string after a member's name in `rest` (`: "…"`), if it is at most 256 bytes long and
/// has no escapes or control characters: then its bytes are its value.
fn plain_string_value(rest: &[u8]) -> Option<&str> {
    let rest = trim_start(rest);
    let rest = trim_start(rest.strip_prefix(b":")?);
    let rest = rest.strip_prefix(b"\"")?;
    let end = rest
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
    if rest[end] != b'"' || end > 256 {
        return None;
    }
    std::str::from_utf8(&rest[..end]).ok()
}

/// Reads a JSON object's members in order until the one named `model`. The values before it
/// are skipped (serde_json skips without building anything) and the ones after it are never
/// read: a body whose `model` comes first costs the same whatever its size. `None` if the body
/// is not an object, its `model` is not a string, or the JSON breaks before `model`.
fn top_level_model(body: &[u8]) -> Option<CompactString> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
    use std::fmt;

    /// Whether a member's name is `model`, read without allocating (escaped or not).
    struct IsModel;
    impl<'de> DeserializeSeed<'de> for IsModel {
        type Value = bool;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_str(self)
        }
    }
    impl Visitor<'_> for IsModel {
        type Value = bool;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a member name")
        }
        fn visit_str<E>(self, name: &str) -> Result<bool, E> {
            Ok(name == "model")
        }
    }

    struct FindModel<'m>(&'m mut Option<CompactString>);
    impl<'de> Visitor<'de> for FindModel<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<(), A::Error> {
            while let Some(is_model) = members.next_key_seed(IsModel)? {
                if is_model {
                    *self.0 = members.next_value()?;
                    return Ok(());
                }
                members.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }

    let mut model = None;
    // Stopping at `model` leaves the rest of the object unread, which the deserializer reports
    // as an error; what was found before that stands.
    let _ = serde_json::Deserializer::from_slice(body).deserialize_map(FindModel(&mut model));
    model
}

/// `s` cut to its first `max` characters.
/// Most characters of a `model` kept for the audit record.
pub const MODEL_CHARS: usize = 256;

/// `s` cut to its first `max` characters.
pub fn truncate_chars(mut s: CompactString, max: usize) -> CompactString {
    if let Some((end, _)) = s.char_indices().nth(max) {
        s.truncate(end);
    }
    s
}

/// `b` without its leading JSON whitespace.
fn trim_start(b: &[u8]) -> &[u8] {
    let n = b
        .iter()
        .take_while(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
        .count();
    &b[n..]
}

#[cfg(test)]
mod tests {
    use super::sniff_model;

    #[test]
    fn finds_the_model_of_complete_and_truncated_bodies() {
        let body = br#"{"messages":[{"role":"user","content":"hi"}],"model":"m-1"}"#;
        assert_eq!(sniff_model(body, true).as_deref(), Some("m-1"));
        assert_eq!(
            sniff_model(&body[..body.len() - 1], false).as_deref(),
            Some("m-1")
        );
        let truncated = br#"{"model" : "big-model", "input": "xxxxxxxx"#;
        assert_eq!(sniff_model(truncated, false).as_deref(), Some("big-model"));
        assert_eq!(sniff_model(b"not json", true), None);
        assert_eq!(sniff_model(br#"{"model": 5}"#, true), None);
        assert_eq!(sniff_model(br#"{"input": [1, {"a": null}]}"#, true), None);
        assert_eq!(
            sniff_model(br#"{"model": "caf\u00e9", "n": 1}"#, true).as_deref(),
            Some("café")
        );
        assert_eq!(sniff_model(br#"[1, 2]"#, true), None);
        assert_eq!(sniff_model(br#"{"model": "unterminated"#, false), None);
        assert_eq!(sniff_model(br#"{"model": "esc\"aped"}"#, false), None);
    }

    #[test]
    fn a_model_sent_first_is_read_as_the_deserializer_reads_it() {
        let long = format!(r#"{{"model":"{}"}}"#, "m".repeat(300));
        let exactly = format!(r#"{{"model":"{}"}}"#, "m".repeat(256));
        let bodies: [&[u8]; 14] = [
            br#"{"model":"m-1","messages":[{"role":"user","content":"hi"}]}"#,
            b" {\r\n\t\"model\" :\n \"m-1\" , \"n\": 1}",
            br#"{"model":"first", "messages": [1, 2,"#,
            br#"{"model":"caf\u00e9"}"#,
            br#"{"model":"esc\"aped"}"#,
            b"{\"model\":\"tab\there\"}",
            b"{\x0c\"model\":\"form feed is not JSON whitespace\"}",
            br#"{"model":5}"#,
            br#"{"model":null}"#,
            br#"{"model":"unterminated"#,
            br#"{"models":"plural"}"#,
            br#"["model","m"]"#,
            long.as_bytes(),
            exactly.as_bytes(),
        ];
        for body in bodies {
            let by_deserializer =
                super::top_level_model(body).map(|m| super::truncate_chars(m, 256));
            assert_eq!(
                sniff_model(body, true),
                by_deserializer,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert_eq!(sniff_model(bodies[1], true).as_deref(), Some("m-1"));
        assert_eq!(sniff_model(bodies[2], true).as_deref(), Some("first"));
        assert_eq!(sniff_model(bodies[13], true).map(|m| m.len()), Some(256));
    }

    #[test]
    fn a_complete_body_is_read_only_as_far_as_its_top_level_model() {
        // Nested `model` members are not the request's model, however early they come.
        let nested = br#"{"messages":[{"model":"inner","content":"x"}],"metadata":{"model":"m"},"model":"top"}"#;
        assert_eq!(sniff_model(nested, true).as_deref(), Some("top"));
        assert_eq!(
            sniff_model(br#"{"metadata":{"model":"inner"}}"#, true),
            None
        );
        // What follows `model` is never read, so it cannot spoil the answer...
        let then_broken = br#"{"model":"first", "messages": [1, 2,"#;
        assert_eq!(sniff_model(then_broken, true).as_deref(), Some("first"));
        // ...but JSON that breaks before it has no model.
        assert_eq!(
            sniff_model(br#"{"messages": [1,, "model":"m"}"#, true),
            None
        );
        // An escaped member name is still `model`; a null model is none.
        assert_eq!(
            sniff_model(br#"{"mod\u0065l":"escaped-name"}"#, true).as_deref(),
            Some("escaped-name")
        );
        assert_eq!(sniff_model(br#"{"model":null,"n":1}"#, true), None);
        // At most 256 characters are kept, cut on a character boundary.
        let long = format!(r#"{{"model":"{}"}}"#, "é".repeat(300));
        assert_eq!(
            sniff_model(long.as_bytes(), true),
            Some("é".repeat(256).into())
        );
    }
}
