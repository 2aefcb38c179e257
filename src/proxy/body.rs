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
