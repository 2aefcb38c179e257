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
//!
//! The gateway's headers go straight into the `http` map, under names parsed once
//! (`HeaderName::from_static`): Pingora's `insert_header` parses and copies the name on every
//! call.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};

/// Headers to add to a message, each replacing any of the same name.
pub type Added<'a> = &'a mut dyn Iterator<Item = (&'static HeaderName, HeaderValue)>;

/// Drops the `removed` headers from `req` and adds `added`. The request loses its name map
/// first (so a removal is one map's, not two), unless its target is one the URI does not
/// reproduce byte for byte (absolute-form, or not UTF-8): Pingora keeps that target only next
/// to the name map, so such a request is edited through Pingora.
pub fn edit_request_headers(
    req: &mut RequestHeader,
    removed: &[&HeaderName],
    added: Added,
) -> pingora::Result<()> {
    let from_uri = req.uri.path_and_query().map(|p| p.as_str().as_bytes());
    if from_uri != Some(req.raw_path()) || !req.raw_path_is_utf8() {
        for name in removed {
            req.remove_header(*name);
        }
        for (name, value) in added {
            req.insert_header(name, value)?;
        }
        return Ok(());
    }
    let send_end_stream = req.send_end_stream();
    let placeholder = RequestHeader::from(http::Request::new(()).into_parts().0);
    let mut parts = http::request::Parts::from(std::mem::replace(req, placeholder));
    for name in removed {
        parts.headers.remove(*name);
    }
    insert(&mut parts.headers, added);
    *req = RequestHeader::from(parts);
    if let Some(end) = send_end_stream {
        req.set_send_end_stream(end);
    }
    Ok(())
}

/// Adds `added` to `resp`, which loses its name map first. A reason phrase other than the
/// status's own is kept.
pub fn insert_response_headers(resp: &mut ResponseHeader, added: Added) {
    let placeholder = ResponseHeader::from(http::Response::new(()).into_parts().0);
    let taken = std::mem::replace(resp, placeholder);
    // Pingora keeps a reason only when it is not the status's own.
    let reason = taken
        .get_reason_phrase()
        .filter(|r| Some(*r) != taken.status.canonical_reason())
        .map(str::to_owned);
    let mut parts = http::response::Parts::from(taken);
    insert(&mut parts.headers, added);
    *resp = ResponseHeader::from(parts);
    if reason.is_some() {
        // Accepted once from the backend, so accepted again.
        let _ = resp.set_reason_phrase(reason.as_deref());
    }
}

/// An id (request, key, workspace) as a header value. Ids are ASCII; one that is not fails the
/// request, not the process.
pub fn id_value(id: &str) -> pingora::Result<HeaderValue> {
    HeaderValue::from_str(id).map_err(|_| {
        pingora::Error::explain(
            pingora::ErrorType::InvalidHTTPHeader,
            "id is no header value",
        )
    })
}

/// Header values of one request made together, in one allocation.
///
/// Made one by one, each of a forwarded request's values (its id on the request and on the
/// answer, the key's workspace and id, the rate-limit numbers) was an allocation and a copy
/// of its own. Here the `parts` are copied once into a buffer that moves to the heap whole,
/// and each value is a counted reference to its slice of it. Parts longer in all than the
/// buffer go to a vector instead. A part that is no header value fails the request, as
/// [`id_value`] does.
pub fn joint_values<const N: usize>(parts: [&[u8]; N]) -> pingora::Result<[HeaderValue; N]> {
    let len = parts.iter().map(|p| p.len()).sum();
    let joint = if len <= JOINT_CAPACITY {
        let mut joint = Joint {
            len,
            bytes: [0; JOINT_CAPACITY],
        };
        let mut at = 0;
        for part in parts {
            joint.bytes[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        Bytes::from_owner(joint)
    } else {
        Bytes::from(parts.concat())
    };
    let mut at = 0;
    let mut invalid = false;
    let values = parts.map(|part| {
        let value = HeaderValue::from_maybe_shared(joint.slice(at..at + part.len()));
        at += part.len();
        value.unwrap_or_else(|_| {
            invalid = true;
            HeaderValue::from_static("")
        })
    });
    if invalid {
        return Err(pingora::Error::explain(
            pingora::ErrorType::InvalidHTTPHeader,
            "id is no header value",
        ));
    }
    Ok(values)
}

/// Bytes [`joint_values`] holds in one block: a request's values are about 100 (three ids of
/// 24 and two numbers, or four ids for a scoped token).
const JOINT_CAPACITY: usize = 128;

/// The buffer of [`joint_values`], owned by the `Bytes` its values share.
struct Joint {
    len: usize,
    bytes: [u8; JOINT_CAPACITY],
}

impl AsRef<[u8]> for Joint {
    fn as_ref(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or_default()
    }
}

/// `n` as a header value: for the seconds of a minute window (`RateLimit-Reset`, on every
/// forwarded answer), a static one, which costs no allocation, and for any other number a new
/// one.
pub fn seconds_value(n: u64) -> HeaderValue {
    const SECONDS: [&str; 61] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
        "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31",
        "32", "33", "34", "35", "36", "37", "38", "39", "40", "41", "42", "43", "44", "45", "46",
        "47", "48", "49", "50", "51", "52", "53", "54", "55", "56", "57", "58", "59", "60",
    ];
    match usize::try_from(n).ok().and_then(|i| SECONDS.get(i)) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(n),
    }
}

/// Inserts `added` into `headers`, grown once.
fn insert(headers: &mut HeaderMap, added: Added) {
    let (least, most) = added.size_hint();
    headers.reserve(most.unwrap_or(least));
    for (name, value) in added {
        headers.insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static WORKSPACE: HeaderName = HeaderName::from_static("service-workspace");
    static CUSTOM: HeaderName = HeaderName::from_static("x-custom");

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
        req.append_header("X-Trace", "1").unwrap();
        req.append_header("X-Trace", "2").unwrap();
        req.append_header("Content-Type", "application/json")
            .unwrap();
        req.append_header("Authorization", "Bearer secret").unwrap();
        let added = [
            (&WORKSPACE, HeaderValue::from_static("ws_1")),
            (&CUSTOM, HeaderValue::from_static("c")),
        ];
        let removed = [&http::header::AUTHORIZATION, &WORKSPACE];
        edit_request_headers(&mut req, &removed, &mut added.into_iter()).unwrap();
        assert!(!req.has_case());
        assert_eq!(req.method, http::Method::POST);
        assert_eq!(req.raw_path(), b"/v1/chat?stream=1");
        assert_eq!(
            wire(&req),
            "x-custom: c\r\nx-trace: 1\r\nx-trace: 2\r\nContent-Type: application/json\r\nservice-workspace: ws_1\r\n"
        );
    }

    #[test]
    fn every_removed_name_a_request_has_goes_with_all_its_values() {
        let names: Vec<HeaderName> = (0..8)
            .map(|i| HeaderName::from_bytes(format!("x-drop-{i}").as_bytes()).unwrap())
            .collect();
        let mut removed: Vec<&HeaderName> = names.iter().collect();
        removed.insert(3, &http::header::AUTHORIZATION);
        for target in [&b"/v1/chat"[..], b"http://backend/v1/chat"] {
            let mut req = RequestHeader::build("POST", target, None).unwrap();
            req.append_header("Authorization", "Bearer secret").unwrap();
            // The first, one with two values, and the last.
            for name in ["x-drop-0", "x-drop-5", "x-drop-5", "x-drop-7"] {
                req.append_header(name, "v").unwrap();
            }
            req.append_header("X-Custom", "kept").unwrap();
            edit_request_headers(&mut req, &removed, &mut [].into_iter()).unwrap();
            assert_eq!(
                wire(&req).to_lowercase(),
                "x-custom: kept\r\n",
                "{target:?}"
            );
        }
    }

    #[test]
    fn an_absolute_form_target_keeps_the_name_map() {
        let mut req = RequestHeader::build("GET", b"http://backend/v1/models", None).unwrap();
        req.append_header("X-Custom", "a").unwrap();
        req.append_header("X-Custom", "b").unwrap();
        req.append_header("Authorization", "Bearer secret").unwrap();
        let added = [(&WORKSPACE, HeaderValue::from_static("ws_1"))];
        let removed = [&http::header::AUTHORIZATION];
        edit_request_headers(&mut req, &removed, &mut added.into_iter()).unwrap();
        assert!(req.has_case());
        assert_eq!(req.raw_path(), b"http://backend/v1/models");
        assert_eq!(
            wire(&req),
            "X-Custom: a\r\nX-Custom: b\r\nservice-workspace: ws_1\r\n"
        );
    }

    #[test]
    fn seconds_are_written_as_numbers() {
        for n in [0, 1, 9, 10, 59, 60, 61, 3_600, u64::MAX] {
            assert_eq!(seconds_value(n), n.to_string().as_str());
        }
    }

    #[test]
    fn joint_values_are_their_parts_cut_from_one_buffer() {
        let parts: [&[u8]; 5] = [b"ws_abc", b"", b"req_0123456789", b"42", b"7"];
        let values = joint_values(parts).unwrap();
        for (value, part) in values.iter().zip(parts) {
            assert_eq!(value.as_bytes(), part);
        }
        // One buffer: each value starts where the one before it ends.
        let start = values[0].as_bytes().as_ptr() as usize;
        assert_eq!(values[2].as_bytes().as_ptr() as usize, start + 6);
        assert_eq!(values[3].as_bytes().as_ptr() as usize, start + 6 + 14);
        // A value outlives the others and the buffer's first handle.
        let [_, _, id, _, _] = values;
        assert_eq!(id, "req_0123456789");
    }

    #[test]
    fn joint_values_longer_than_the_buffer_are_whole() {
        let long = "k".repeat(JOINT_CAPACITY);
        let values = joint_values([b"ws_1".as_slice(), long.as_bytes(), b"9"]).unwrap();
        assert_eq!(values[0], "ws_1");
        assert_eq!(values[1], long.as_str());
        assert_eq!(values[2], "9");
    }

    #[test]
    fn a_joint_part_that_is_no_header_value_fails_the_request() {
        for bad in [b"req_1\r\nx: y".as_slice(), b"\0", b"\x7f"] {
            let err = joint_values([b"ws_1".as_slice(), bad]).unwrap_err();
            assert_eq!(err.etype(), &pingora::ErrorType::InvalidHTTPHeader);
        }
        let long_bad = format!("{}\n", "k".repeat(JOINT_CAPACITY));
        assert!(joint_values([long_bad.as_bytes()]).is_err());
    }

    #[test]
    fn a_response_keeps_its_status_headers_and_own_reason() {
        let mut resp = ResponseHeader::build(299, None).unwrap();
        resp.set_reason_phrase(Some("Mostly Fine")).unwrap();
        resp.append_header("Service-Credits", "2.5").unwrap();
        insert_response_headers(
            &mut resp,
            &mut [(&CUSTOM, HeaderValue::from(7u32))].into_iter(),
        );
        assert!(!resp.has_case());
        assert_eq!(resp.status.as_u16(), 299);
        assert_eq!(resp.get_reason_phrase(), Some("Mostly Fine"));
        assert_eq!(resp.headers["service-credits"], "2.5");
        assert_eq!(resp.headers["x-custom"], "7");

        let mut ok = ResponseHeader::build(200, None).unwrap();
        ok.set_reason_phrase(Some("OK")).unwrap();
        insert_response_headers(&mut ok, &mut [].into_iter());
        assert_eq!(ok.get_reason_phrase(), Some("OK"));
    }
}
