//! Request framing the backend could read differently from the gateway.
//!
//! Pingora reads a request's body by its `Transfer-Encoding` or `Content-Length`, and writes
//! it to the backend afresh; the framing headers it passes on as they came must tell the
//! backend the same:
//! - A transfer coding besides `chunked` (`gzip, chunked`): Pingora takes the chunks apart and
//!   sends the body on without the coding, so the backend would read compressed bytes as the
//!   body. Refused with a 400 (RFC 9112 §6.1 suggests 501; the gateway answers bad input
//!   with 400). A body is compressed with `Content-Encoding`, which goes on as it is.
//! - Equal `Content-Length` lines, which Pingora accepts and passes on: the backend gets one.
//!   (Lines that differ Pingora refuses itself, with its bare 400; both `Transfer-Encoding` and
//!   `Content-Length` it takes care of: it drops the length, reads the body by its chunks and
//!   closes the connection after the answer, per RFC 9112 §6.1.)
//! - An HTTP/1.0 request without `Host` goes to the backend as HTTP/1.1, which must have one:
//!   it gets the backend's address as configured.
//! - An absolute-form target (`GET http://host/v1/models`) goes to the backend in origin form
//!   (`/v1/models`) with the backend's address as `Host`: the host the client named is not
//!   the backend's to act on.
//!
//! And on the way back: an HTTP/1.0 client does not know chunks, so a streamed (chunked)
//! answer goes to it as the body until the connection closes (RFC 9112 §6.1: no
//! `Transfer-Encoding` in an answer to an HTTP/1.0 request).

use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderValue, Version};
use pingora::http::{RequestHeader, ResponseHeader};

use crate::error::ApiError;

/// The most bytes of header names and values a request may carry (431 past it). Pingora takes
/// a much larger header section; a backend behind the gateway need not, and what a client
/// sends in headers is forwarded whole.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Refuses a header section over [`MAX_HEADER_BYTES`], and a transfer coding besides
/// `chunked` (see the module).
pub fn check(req: &RequestHeader) -> Result<(), ApiError> {
    let size: usize = req
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if size > MAX_HEADER_BYTES {
        return Err(ApiError::HeadersTooLarge(
            format!("the request's headers are larger than {MAX_HEADER_BYTES} bytes").into(),
        ));
    }
    let mut codings = req
        .headers
        .get_all(TRANSFER_ENCODING)
        .iter()
        .flat_map(|line| line.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        // A list may have empty elements (RFC 9110 §5.6.1).
        .filter(|coding| !coding.is_empty());
    match (codings.next(), codings.next()) {
        (None, _) => Ok(()),
        (Some(coding), None) if coding.eq_ignore_ascii_case(b"chunked") => Ok(()),
        _ => Err(ApiError::invalid(
            "the only transfer coding accepted is chunked; send a compressed body with \
             Content-Encoding",
        )),
    }
}

/// Makes the request's framing headers the backend's: one `Content-Length` line, and a `Host`
/// (`backend`'s address) for a request that came as HTTP/1.0 without one.
pub fn for_backend(
    req: &mut RequestHeader,
    came_as: Version,
    backend: &HeaderValue,
) -> pingora::Result<()> {
    let mut lengths = req.headers.get_all(CONTENT_LENGTH).iter();
    if let (Some(first), Some(_)) = (lengths.next(), lengths.next()) {
        // Equal (Pingora refuses lines that differ): one says it.
        let first = first.clone();
        req.insert_header(CONTENT_LENGTH, first)?;
    }
    if came_as == Version::HTTP_10 && !req.headers.contains_key(HOST) {
        req.insert_header(HOST, backend.clone())?;
    }
    Ok(())
}

/// Makes an absolute-form target (`http://host/path?query`) the origin form (`/path?query`),
/// with `backend` (the configured backend's address) as `Host`.
pub fn to_origin_form(
    req: &mut RequestHeader,
    backend: Option<&HeaderValue>,
) -> pingora::Result<()> {
    let origin = req
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    let uri = http::Uri::try_from(origin).map_err(|_| {
        pingora::Error::explain(
            pingora::ErrorType::InvalidHTTPHeader,
            "no origin-form target",
        )
    })?;
    req.set_uri(uri);
    if let Some(host) = backend {
        req.insert_header(HOST, host.clone())?;
    }
    Ok(())
}

/// Makes a backend's answer one an HTTP/1.0 client can read: without `Transfer-Encoding`, so
/// its body goes as it is and ends with the connection. Returns whether it did, and so whether
/// the connection must close after the answer.
pub fn for_http10_client(resp: &mut ResponseHeader) -> bool {
    if !resp.headers.contains_key(TRANSFER_ENCODING) {
        return false;
    }
    resp.remove_header(&TRANSFER_ENCODING);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
        for (name, value) in headers {
            req.append_header(name.to_string(), *value).unwrap();
        }
        req
    }

    #[test]
    fn only_chunked_alone_passes() {
        for fine in [
            &[][..],
            &[("Transfer-Encoding", "chunked")],
            &[("Transfer-Encoding", "Chunked")],
            &[("Transfer-Encoding", " chunked ,")],
            &[("Content-Length", "2")],
            &[("Content-Length", "2"), ("Content-Length", "2")],
        ] {
            assert!(check(&request(fine)).is_ok(), "{fine:?}");
        }
        for refused in [
            &[("Transfer-Encoding", "gzip, chunked")][..],
            &[
                ("Transfer-Encoding", "gzip"),
                ("Transfer-Encoding", "chunked"),
            ],
            &[("Transfer-Encoding", "chunked, chunked")],
            &[("Transfer-Encoding", "identity")],
        ] {
            let err = check(&request(refused)).unwrap_err();
            assert_eq!(err.status(), 400, "{refused:?}");
        }
    }

    #[test]
    fn an_http10_client_gets_no_chunks() {
        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.append_header("Transfer-Encoding", "chunked").unwrap();
        resp.append_header("Content-Type", "text/event-stream")
            .unwrap();
        assert!(for_http10_client(&mut resp), "the connection closes");
        assert!(!resp.headers.contains_key(TRANSFER_ENCODING));
        assert_eq!(resp.headers["content-type"], "text/event-stream");
        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.append_header("Content-Length", "2").unwrap();
        assert!(!for_http10_client(&mut resp), "a length needs no close");
        assert_eq!(resp.headers[CONTENT_LENGTH], "2");
    }

    #[test]
    fn the_backend_gets_one_length_and_a_host() {
        let backend = HeaderValue::from_static("127.0.0.1:9000");
        let mut req = request(&[("Content-Length", "2"), ("Content-Length", "2")]);
        for_backend(&mut req, Version::HTTP_11, &backend).unwrap();
        let lengths: Vec<_> = req.headers.get_all(CONTENT_LENGTH).iter().collect();
        assert_eq!(lengths, ["2"]);
        assert!(
            !req.headers.contains_key(HOST),
            "only a request that came as HTTP/1.0 gets one"
        );
        for_backend(&mut req, Version::HTTP_10, &backend).unwrap();
        assert_eq!(req.headers[HOST], "127.0.0.1:9000");
        let mut req = request(&[("Host", "api.example.com")]);
        for_backend(&mut req, Version::HTTP_10, &backend).unwrap();
        assert_eq!(req.headers[HOST], "api.example.com", "a Host given is kept");
    }
}
