//! Reading request bodies the gateway answers itself (bounded, so a huge body costs nothing).

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

/// The top-level `model` of a JSON body, from its first [`SNIFF_LIMIT`] bytes. A complete body
/// is parsed; a longer one is scanned for the first `"model": "…"`.
pub fn sniff_model(prefix: &[u8], complete: bool) -> Option<String> {
    if complete {
        // Only `model` is kept: the rest of the body is skipped without building anything.
        #[derive(serde::Deserialize)]
        struct Sniffed<'a> {
            #[serde(borrow, default)]
            model: Option<std::borrow::Cow<'a, str>>,
        }
        let sniffed: Sniffed = serde_json::from_slice(prefix).ok()?;
        return sniffed.model.map(|m| m.chars().take(256).collect());
    }
    let needle = b"\"model\"";
    let start = prefix.windows(needle.len()).position(|w| w == needle)? + needle.len();
    let rest = &prefix[start..];
    let rest = trim_start(rest);
    let rest = trim_start(rest.strip_prefix(b":")?);
    let rest = rest.strip_prefix(b"\"")?;
    let end = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
    if rest[end] != b'"' || end > 256 {
        return None;
    }
    std::str::from_utf8(&rest[..end]).ok().map(str::to_owned)
}

fn trim_start(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|c| c.is_ascii_whitespace()).count();
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
}
