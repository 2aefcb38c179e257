//! Stream replies (`XRANGE`, `XREVRANGE`, `XREAD`, `XREADGROUP`, `XAUTOCLAIM`), read entry by
//! entry.
//!
//! redis-rs's typed replies keep each entry's fields under `String` names, and one name that
//! is not UTF-8 fails the whole reply. Backends write to the event log directly, so one such
//! entry would stop every reader: the listen streams, and the webhook workers, whose reclaim
//! of a dead worker's entries would then fail for good. Here a name is read as UTF-8 with
//! replacement characters: no field the gateway reads is then named so, and the field is
//! ignored as any other it does not read (a value the gateway reads that is not UTF-8 makes
//! its entry malformed, and skipped). Only a reply not shaped as Redis sends them is an error.

use redis::streams::StreamId;
use redis::Value;

use crate::store::StoreError;

/// The entries of an `XRANGE` or `XREVRANGE` reply, in its order. (Redis 6.2's `XAUTOCLAIM`
/// answers an entry deleted while pending with `nil`: there is nothing to read.)
pub(super) fn range(reply: Value) -> Result<Vec<StreamId>, StoreError> {
    match reply {
        Value::Array(entries) => entries
            .into_iter()
            .filter(|e| !matches!(e, Value::Nil))
            .map(entry)
            .collect(),
        Value::Nil => Ok(Vec::new()),
        other => Err(unexpected("a range", &other)),
    }
}

/// The entries of an `XREAD` or `XREADGROUP` reply for one stream: none when its wait ended
/// with nothing new.
pub(super) fn read(reply: Value) -> Result<Vec<StreamId>, StoreError> {
    // RESP2: [[stream, entries], …]; RESP3: {stream: entries, …}.
    let streams: Vec<Value> = match reply {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(streams) => streams
            .into_iter()
            .map(|s| match s {
                Value::Array(pair) => pair.into_iter().nth(1).unwrap_or(Value::Nil),
                other => other,
            })
            .collect(),
        Value::Map(streams) => streams.into_iter().map(|(_, entries)| entries).collect(),
        other => return Err(unexpected("a read", &other)),
    };
    let mut out = Vec::new();
    for entries in streams {
        out.extend(range(entries)?);
    }
    Ok(out)
}

/// An `XAUTOCLAIM` reply: where the next call starts (`0-0` once the whole pending list was
/// looked at), and the entries claimed (those deleted meanwhile are not among them).
pub(super) fn autoclaim(reply: Value) -> Result<(String, Vec<StreamId>), StoreError> {
    let Value::Array(parts) = reply else {
        return Err(unexpected("an autoclaim", &reply));
    };
    let mut parts = parts.into_iter();
    let next = parts.next().and_then(|v| text(&v));
    let claimed = parts.next().map(range).transpose()?;
    match (next, claimed) {
        (Some(next), Some(claimed)) => Ok((next, claimed)),
        _ => Err(StoreError::Unavailable(
            "Redis sent an autoclaim reply of an unexpected shape".into(),
        )),
    }
}

/// One entry: `[id, [name, value, …]]`. An entry whose fields are gone (`nil`: deleted while
/// pending) has none.
fn entry(value: Value) -> Result<StreamId, StoreError> {
    let shape =
        || StoreError::Unavailable("Redis sent a stream entry of an unexpected shape".into());
    let Value::Array(parts) = value else {
        return Err(shape());
    };
    let mut parts = parts.into_iter();
    let id = parts.next().and_then(|v| text(&v)).ok_or_else(shape)?;
    let map = match parts.next() {
        Some(Value::Array(fields)) => {
            let mut fields = fields.into_iter();
            let mut map = std::collections::HashMap::with_capacity(fields.len() / 2);
            while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
                map.insert(name_of(&name).ok_or_else(shape)?, value);
            }
            map
        }
        Some(Value::Map(fields)) => {
            let mut map = std::collections::HashMap::with_capacity(fields.len());
            for (name, value) in fields {
                map.insert(name_of(&name).ok_or_else(shape)?, value);
            }
            map
        }
        Some(Value::Nil) | None => Default::default(),
        Some(_) => return Err(shape()),
    };
    Ok(StreamId {
        id,
        map,
        ..Default::default()
    })
}

/// A field's name, as UTF-8 with replacement characters.
fn name_of(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// An entry id or cursor: ASCII, as Redis makes them.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn unexpected(what: &str, value: &Value) -> StoreError {
    let kind = match value {
        Value::Int(_) => "an integer",
        Value::BulkString(_) | Value::SimpleString(_) => "a string",
        Value::ServerError(_) => "an error",
        _ => "another type",
    };
    StoreError::Unavailable(format!("Redis sent {kind} for {what} reply of a stream"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(bytes: &[u8]) -> Value {
        Value::BulkString(bytes.to_vec())
    }

    fn raw_entry(id: &str, fields: &[(&[u8], &[u8])]) -> Value {
        Value::Array(vec![
            bulk(id.as_bytes()),
            Value::Array(
                fields
                    .iter()
                    .flat_map(|(n, v)| [bulk(n), bulk(v)])
                    .collect(),
            ),
        ])
    }

    #[test]
    fn a_field_name_that_is_not_utf8_is_read_with_replacement_characters() {
        let reply = Value::Array(vec![
            raw_entry("1-0", &[(b"type", b"a.b"), (b"\xff\xfe", b"x")]),
            raw_entry("2-0", &[(b"type", b"c.d")]),
        ]);
        let entries = range(reply).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].id, "1-0");
        assert_eq!(entries[0].map.len(), 2);
        assert!(entries[0].map.contains_key("\u{FFFD}\u{FFFD}"));
        assert_eq!(entries[1].get::<String>("type").as_deref(), Some("c.d"));
    }

    #[test]
    fn reads_of_both_protocols_and_a_wait_that_ended_empty() {
        let entries = || Value::Array(vec![raw_entry("5-1", &[(b"k", b"v")])]);
        let resp2 = Value::Array(vec![Value::Array(vec![bulk(b"{ns}:events"), entries()])]);
        let resp3 = Value::Map(vec![(bulk(b"{ns}:events"), entries())]);
        for reply in [resp2, resp3] {
            let read = read(reply).unwrap();
            assert_eq!(read.len(), 1);
            assert_eq!(read[0].id, "5-1");
            assert_eq!(read[0].get::<String>("k").as_deref(), Some("v"));
        }
        assert!(read(Value::Nil).unwrap().is_empty());
    }

    #[test]
    fn an_autoclaim_gives_its_next_start_and_claimed_entries_with_deleted_ones_empty() {
        let reply = Value::Array(vec![
            bulk(b"0-0"),
            Value::Array(vec![
                raw_entry("7-0", &[(b"type", b"a.b")]),
                Value::Array(vec![bulk(b"8-0"), Value::Nil]),
                // Redis 6.2's form of an entry deleted while pending.
                Value::Nil,
            ]),
            Value::Array(vec![]),
        ]);
        let (next, claimed) = autoclaim(reply).unwrap();
        assert_eq!(next, "0-0");
        assert_eq!(claimed.len(), 2);
        assert!(claimed[1].map.is_empty());
    }

    #[test]
    fn replies_of_another_shape_are_errors_not_panics() {
        for reply in [Value::Int(3), bulk(b"x"), Value::Array(vec![Value::Int(1)])] {
            assert!(range(reply.clone()).is_err());
            assert!(read(reply.clone()).is_err());
            assert!(autoclaim(reply).is_err());
        }
        assert!(range(Value::Array(vec![Value::Array(vec![Value::Int(1)])])).is_err());
    }
}
