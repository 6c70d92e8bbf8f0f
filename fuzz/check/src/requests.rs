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
//! The admin socket's line reader (`read_admin_line`), given the bytes in
//! arbitrary pieces with `WouldBlock` and `Interrupted` between them, takes
//! exactly the bytes before the first newline (all of them at the end of the
//! stream) or refuses a request longer than its limit, whatever the pieces,
//! within one call per piece, reading at most two limits ahead.
//!
//! For the metrics request: never a panic; the route depends only on the
//! first two whitespace-separated words (method, path without query), is the
//! exposition exactly for `GET`/`HEAD` of `/metrics` or `/`, and `HEAD` is
//! the only method without a body.

use dlcp::metrics::{Route, route};
use dlcp::proto::endpoint::OpId;
use dlcp::service::fuzzing::{AdminRequest, MAX_ADMIN_REQUEST, read_admin_line};

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

/// A client's bytes as a non-blocking socket hands them over: in pieces of
/// the sizes given (cycled), `WouldBlock` after each piece (the event loop
/// calls again on the next readiness), an `Interrupted` now and then, and
/// the end of the stream after the last byte.
struct Trickle<'a> {
    bytes: &'a [u8],
    pieces: &'a [u8],
    next: usize,
    blocked: bool,
    interrupt_every: u8,
    calls: u32,
}

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        self.calls += 1;
        if self.interrupt_every > 0 && self.calls % u32::from(self.interrupt_every) == 0 {
            return Err(std::io::ErrorKind::Interrupted.into());
        }
        if std::mem::take(&mut self.blocked) {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        let want = match self.pieces {
            [] => usize::MAX,
            p => usize::from(p[self.next % p.len()]).max(1),
        };
        self.next += 1;
        let n = want.min(out.len()).min(self.bytes.len());
        out[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        self.blocked = n > 0;
        Ok(n)
    }
}

/// The admin socket's line reader on `bytes` delivered in `pieces`: the
/// same outcome as the rule says, whatever the pieces, and within one call
/// per piece.
fn check_admin_reader(bytes: &[u8], pieces: &[u8], interrupt_every: u8) {
    let mut r = Trickle { bytes, pieces, next: 0, blocked: false, interrupt_every, calls: 0 };
    let mut buf = Vec::new();
    let mut got = None;
    for _ in 0..=bytes.len() + 2 {
        match read_admin_line(&mut r, &mut buf) {
            Ok(None) => continue,
            done => {
                got = Some(done);
                break;
            }
        }
    }
    let got = got.unwrap_or_else(|| panic!("no outcome for {bytes:?} in pieces {pieces:?}"));
    // The rule: the request is the bytes up to the first newline (all of
    // them at the end of the stream), refused when longer than the limit.
    let end = bytes.iter().position(|&b| b == b'\n').unwrap_or(bytes.len());
    match got {
        Ok(Some(line)) => {
            assert!(end <= MAX_ADMIN_REQUEST, "a {end}-byte request was taken");
            assert_eq!(line, String::from_utf8_lossy(&bytes[..end]), "pieces {pieces:?}");
        }
        Err(e) => {
            assert!(end > MAX_ADMIN_REQUEST, "a {end}-byte request refused: {e}");
            assert!(e.contains("longer than"), "{e}");
        }
        Ok(None) => unreachable!(),
    }
    assert!(buf.len() <= bytes.len().min(2 * MAX_ADMIN_REQUEST), "read {} bytes ahead", buf.len());
}

/// Run one admin request line.
pub fn check_admin(data: &[u8]) {
    let mut input = Input::new(data);
    // Interrupted on every 2nd to 8th read, or never (0); never on every
    // read, which no socket does and which the reader rightly retries forever.
    let reader =
        input.bool().then(|| (input.blob(6).to_vec(), [0, 2, 3, 4, 5, 6, 7, 8][usize::from(input.u8() % 8)]));
    let bytes = if input.bool() { assemble(&mut input, ADMIN_WORDS) } else { input.rest().to_vec() };
    if let Some((pieces, interrupt_every)) = reader {
        check_admin_reader(&bytes, &pieces, interrupt_every);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reader_takes_a_line_at_the_limit_in_any_pieces_and_refuses_one_byte_more() {
        let mut at_limit = vec![b'x'; MAX_ADMIN_REQUEST];
        at_limit.extend_from_slice(b"\nstats\n");
        let mut over = vec![b'x'; MAX_ADMIN_REQUEST + 1];
        over.push(b'\n');
        for pieces in [&[][..], &[1], &[200, 3], &[255, 1, 7]] {
            for every in [0, 2, 5] {
                check_admin_reader(&at_limit, pieces, every);
                check_admin_reader(&over, pieces, every);
                check_admin_reader(b"status", pieces, every);
                check_admin_reader(b"", pieces, every);
            }
        }
    }
}
