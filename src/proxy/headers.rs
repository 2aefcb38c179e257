//! Header maps the gateway adds to on every forwarded request and its response.
//!
//! Pingora keeps a second, case-preserving map of header names next to the `http` header map
//! of an HTTP/1.1 message, and sizes both to exactly the headers parsed. So each header the
//! gateway adds (five on the request, four on the response) was inserted twice and grew both
//! maps: about a tenth of the instructions of a proxied request. Header names are
//! case-insensitive (RFC 9110 §5.1), and HTTP/2 keeps no case at all, so before adding to a
//! message the gateway drops the name map and reserves room for what it adds. On the wire, a
//! dozen common names are then written capitalized as Pingora knows them (`Content-Type`) and
//! all others in lower case (`service-request-id`), as Envoy and HTTP/2 do.

use pingora::http::{RequestHeader, ResponseHeader};

/// Makes `req` a message without a name map, with room for `additional` more headers.
///
/// A request whose target the URI does not reproduce byte for byte (absolute-form, or not
/// UTF-8) is left as it is: Pingora keeps that target only next to the name map.
pub fn prepare_request(req: &mut RequestHeader, additional: usize) {
    let from_uri = req.uri.path_and_query().map(|p| p.as_str().as_bytes());
    if !req.has_case() || from_uri != Some(req.raw_path()) || !req.raw_path_is_utf8() {
        return;
    }
    let send_end_stream = req.send_end_stream();
    let placeholder = RequestHeader::from(http::Request::new(()).into_parts().0);
    let mut parts = http::request::Parts::from(std::mem::replace(req, placeholder));
    parts.headers.reserve(additional);
    *req = RequestHeader::from(parts);
    if let Some(end) = send_end_stream {
        req.set_send_end_stream(end);
    }
}

/// Makes `resp` a message without a name map, with room for `additional` more headers. A
/// reason phrase other than the status's own is kept.
pub fn prepare_response(resp: &mut ResponseHeader, additional: usize) {
    if !resp.has_case() {
        return;
    }
    let placeholder = ResponseHeader::from(http::Response::new(()).into_parts().0);
    let taken = std::mem::replace(resp, placeholder);
    // Pingora keeps a reason only when it is not the status's own.
    let reason = taken
        .get_reason_phrase()
        .filter(|r| Some(*r) != taken.status.canonical_reason())
        .map(str::to_owned);
    let mut parts = http::response::Parts::from(taken);
    parts.headers.reserve(additional);
    *resp = ResponseHeader::from(parts);
    if reason.is_some() {
        // Accepted once from the backend, so accepted again.
        let _ = resp.set_reason_phrase(reason.as_deref());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(req: &RequestHeader) -> String {
        let mut buf = Vec::new();
        req.header_to_h1_wire(&mut buf);
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn a_request_keeps_its_target_method_and_headers() {
        let mut req = RequestHeader::build("POST", b"/v1/chat?stream=1", Some(2)).unwrap();
        req.append_header("X-Custom", "a").unwrap();
        req.append_header("X-Custom", "b").unwrap();
        req.append_header("Content-Type", "application/json")
            .unwrap();
        prepare_request(&mut req, 5);
        assert!(!req.has_case());
        assert_eq!(req.method, http::Method::POST);
        assert_eq!(req.raw_path(), b"/v1/chat?stream=1");
        let values: Vec<_> = req.headers.get_all("x-custom").iter().collect();
        assert_eq!(values, ["a", "b"]);
        assert!(req.headers.capacity() >= req.headers.len() + 5);
        req.insert_header("Service-Workspace", "ws_1").unwrap();
        assert_eq!(
            wire(&req),
            "x-custom: a\r\nx-custom: b\r\nContent-Type: application/json\r\nservice-workspace: ws_1\r\n"
        );
    }

    #[test]
    fn an_absolute_form_target_keeps_the_name_map() {
        let mut req = RequestHeader::build("GET", b"http://backend/v1/models", None).unwrap();
        req.append_header("X-Custom", "a").unwrap();
        prepare_request(&mut req, 5);
        assert!(req.has_case());
        assert_eq!(req.raw_path(), b"http://backend/v1/models");
    }

    #[test]
    fn a_response_keeps_its_status_headers_and_own_reason() {
        let mut resp = ResponseHeader::build(299, None).unwrap();
        resp.set_reason_phrase(Some("Mostly Fine")).unwrap();
        resp.append_header("Service-Credits", "2.5").unwrap();
        prepare_response(&mut resp, 4);
        assert!(!resp.has_case());
        assert_eq!(resp.status.as_u16(), 299);
        assert_eq!(resp.get_reason_phrase(), Some("Mostly Fine"));
        assert_eq!(resp.headers["service-credits"], "2.5");

        let mut ok = ResponseHeader::build(200, None).unwrap();
        ok.set_reason_phrase(Some("OK")).unwrap();
        prepare_response(&mut ok, 4);
        assert_eq!(ok.get_reason_phrase(), Some("OK"));
    }
}
