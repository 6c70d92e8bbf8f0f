//! The request parsers a local client reaches: the admin socket's request
//! line (`dlcp::service::fuzzing::AdminRequest::parse`) and the metrics
//! endpoint's HTTP request (`dlcp::metrics::route`).
//!
//! Inputs are raw bytes (mode 0) or requests assembled from the words the
//! parsers know, numbers, separators and junk (mode 1), so most of them are
//! near-valid. Checked, for the admin line:
//! - parsing never panics, and surrounding whitespace never changes the result;
//! - `stats`, `status`, `reload` come only from that one word;
//! - `report OP TENSOR` comes only from those three words, and parses again
//!   from its canonical form; an invalid request explains itself.
//!
//! For the metrics request: never a panic; the route depends only on the
//! first two whitespace-separated words (method, path without query), is the
//! exposition exactly for `GET`/`HEAD` of `/metrics` or `/`, and `HEAD` is
//! the only method without a body.

use dlcp::metrics::{Route, route};
use dlcp::proto::endpoint::OpId;
use dlcp::service::fuzzing::AdminRequest;

use crate::input::Input;

const ADMIN_WORDS: &[&str] = &[
    "stats",
    "status",
    "reload",
    "report",
    "0",
    "1",
    "18446744073709551615",
    "18446744073709551616",
    "4294967295",
    "4294967296",
    "-1",
    "+7",
    "STATS",
    "stats\0",
    "report\u{a0}",
    "\u{3000}",
    "é",
];
const SEPARATORS: &[&str] = &[" ", "  ", "\t", "\n", "\r\n", "\u{a0}", "\u{2028}", "", "\u{b}"];
const HTTP_WORDS: &[&str] = &[
    "GET",
    "HEAD",
    "POST",
    "get",
    "/metrics",
    "/",
    "/metrics?x=1",
    "/?",
    "/metricsx",
    "//metrics",
    "HTTP/1.1",
    "HTTP/1.0",
    "Host:",
    "localhost",
    "\u{fffd}",
    "\u{85}",
];

/// Words from `dict` joined by separators, with raw bytes now and then.
fn assemble(input: &mut Input<'_>, dict: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..input.below(8) {
        out.extend_from_slice(input.pick(SEPARATORS).as_bytes());
        match input.u8() {
            0..=199 => out.extend_from_slice(input.pick(dict).as_bytes()),
            200..=239 => out.extend_from_slice(input.u64().to_string().as_bytes()),
            _ => out.extend_from_slice(input.blob(8)),
        }
    }
    out.extend_from_slice(input.pick(SEPARATORS).as_bytes());
    out
}

/// Run one admin request line.
pub fn check_admin(data: &[u8]) {
    let mut input = Input::new(data);
    let bytes = if input.bool() { assemble(&mut input, ADMIN_WORDS) } else { input.rest().to_vec() };
    // As the admin socket hands a request over: its first line, decoded lossily.
    let first = bytes.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let line = &*String::from_utf8_lossy(first);
    let req = AdminRequest::parse(line);
    assert_eq!(AdminRequest::parse(&format!(" \t{line}\n")), req, "whitespace changed {line:?}");
    let words: Vec<&str> = line.split_whitespace().collect();
    match &req {
        AdminRequest::Stats => assert_eq!(words, ["stats"]),
        AdminRequest::Status => assert_eq!(words, ["status"]),
        AdminRequest::Reload => assert_eq!(words, ["reload"]),
        AdminRequest::Report(id) => {
            assert_eq!(words.len(), 3);
            assert_eq!(words[0], "report");
            assert_eq!(words[1].parse::<u64>(), Ok(id.seq));
            assert_eq!(words[2].parse::<u32>(), Ok(id.tensor));
            let canonical = format!("report {} {}", id.seq, id.tensor);
            assert_eq!(AdminRequest::parse(&canonical), AdminRequest::Report(OpId { ..*id }));
        }
        AdminRequest::Invalid(e) => {
            assert!(!e.error.is_empty());
            assert!(!matches!(words.as_slice(), ["stats"] | ["status"] | ["reload"]), "{line:?} refused");
        }
    }
}

/// Run one metrics request.
pub fn check_metrics(data: &[u8]) {
    let mut input = Input::new(data);
    let req = if input.bool() { assemble(&mut input, HTTP_WORDS) } else { input.rest().to_vec() };
    let (r, head) = route(&req);
    let text = String::from_utf8_lossy(&req);
    let words: Vec<&str> = text.split_whitespace().take(2).collect();
    let method = words.first().copied().unwrap_or("");
    let path = words.get(1).map_or("", |p| p.split('?').next().unwrap_or(""));
    assert_eq!(head, method == "HEAD");
    let get = method == "GET" || method == "HEAD";
    let want = match (get, path == "/metrics" || path == "/") {
        (true, true) => Route::Metrics,
        (true, false) => Route::NotFound,
        (false, _) => Route::NotAllowed,
    };
    assert_eq!(r, want, "request {text:?}");
    // Only the first two words count: anything after them changes nothing.
    let mut longer = req.clone();
    longer.extend_from_slice(b" extra\r\n\r\n");
    if words.len() == 2 {
        assert_eq!(route(&longer), (r, head));
    }
}
