//! Audit records written as JSON by hand, byte for byte as `serde_json` writes them.

use serde::Serialize;

use super::AuditRecord;

impl AuditRecord {
    /// Appends `records` to `out` as a JSON array, byte for byte what `serde_json` writes for
    /// them (the format is serde's: records are read back with [`Deserialize`](serde::Deserialize)).
    ///
    /// Every request's record is serialized, off the request path but on the same two cores:
    /// through serde, each field costs a call per name, a scan of its name for characters to
    /// escape, and several small writes, about 4,800 instructions a record. Here the names are
    /// constants written with their punctuation, and a string is handed to `serde_json` only if
    /// it holds a character JSON escapes (ids, key and environment never do).
    pub fn write_json_array(records: &[&AuditRecord], out: &mut Vec<u8>) {
        out.push(b'[');
        for (i, record) in records.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            record.write_json(out);
        }
        out.push(b']');
    }

    /// Appends the record to `out` as `serde_json` writes it, fields in declaration order.
    fn write_json(&self, out: &mut Vec<u8>) {
        let mut number = itoa::Buffer::new();
        out.extend_from_slice(b"{\"time_ms\":");
        out.extend_from_slice(number.format(self.time_ms).as_bytes());
        out.extend_from_slice(b",\"request_id\":");
        json_str(out, &self.request_id);
        out.extend_from_slice(b",\"workspace\":");
        json_str(out, &self.workspace);
        out.extend_from_slice(b",\"key_id\":");
        json_str(out, &self.key_id);
        out.extend_from_slice(b",\"key\":");
        json_str(out, &self.key);
        out.extend_from_slice(b",\"environment\":");
        json_str(out, self.environment.as_str());
        if let Some(project) = &self.project {
            out.extend_from_slice(b",\"project\":");
            json_str(out, project);
        }
        out.extend_from_slice(b",\"method\":");
        json_str(out, &self.method);
        out.extend_from_slice(b",\"path\":");
        json_str(out, &self.path);
        if let Some(model) = &self.model {
            out.extend_from_slice(b",\"model\":");
            json_str(out, model);
        }
        out.extend_from_slice(b",\"status\":");
        out.extend_from_slice(number.format(self.status).as_bytes());
        out.extend_from_slice(b",\"credits\":");
        json_value(out, &self.credits);
        if let Some(ip) = &self.client_ip {
            out.extend_from_slice(b",\"client_ip\":");
            json_value(out, ip);
        }
        out.extend_from_slice(b",\"latency_ms\":");
        out.extend_from_slice(number.format(self.latency_ms).as_bytes());
        if let Some(token_id) = &self.token_id {
            out.extend_from_slice(b",\"token_id\":");
            json_str(out, token_id);
        }
        if let Some(metadata) = &self.metadata {
            out.extend_from_slice(b",\"metadata\":");
            json_value(out, metadata);
        }
        if let Some(key_metadata) = &self.key_metadata {
            out.extend_from_slice(b",\"key_metadata\":");
            json_value(out, key_metadata);
        }
        if let Some(actor) = &self.actor {
            out.extend_from_slice(b",\"actor\":");
            json_str(out, actor);
        }
        out.push(b'}');
    }
}

/// Appends `s` as a JSON string: as it is, quoted, unless it holds a character JSON escapes
/// (a control character, `"` or `\`, the same set as `serde_json`'s), which `serde_json` then
/// escapes.
fn json_str(out: &mut Vec<u8>, s: &str) {
    // Without an early exit, so the compiler checks many bytes at once.
    let escapes = s.bytes().fold(false, |found, b| {
        found | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if !escapes {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        json_value(out, s);
    }
}

/// Appends `value` as `serde_json` writes it.
fn json_value<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing to a vector cannot fail, and none of the record's values (strings, numbers, an
    // address, a map with string keys) can fail to serialize.
    let start = out.len();
    if let Err(e) = serde_json::to_writer(&mut *out, value) {
        tracing::error!(error = %e, "audit record value not serialized");
        out.truncate(start);
        out.extend_from_slice(b"null");
    }
}
