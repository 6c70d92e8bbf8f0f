//! Configuration errors: one line each, naming file, line, column and field.

use std::fmt;
use std::io;
use std::ops::Range;
use std::path::PathBuf;

/// A place in a configuration file (1-based line and column, column in characters).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Location {
    /// The file name as given to `Config::load` / `Config::from_str_named`.
    pub file: String,
    /// Line, starting at 1.
    pub line: usize,
    /// Column in characters, starting at 1.
    pub column: usize,
}

impl Location {
    /// The location of byte offset `offset` in `text`.
    pub fn at(file: &str, text: &str, offset: usize) -> Location {
        let offset = floor_char_boundary(text, offset.min(text.len()));
        let before = &text[..offset];
        let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = text[line_start..offset].chars().count() + 1;
        Location { file: file.to_owned(), line, column }
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// What kind of problem a [`ConfigError::Invalid`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The file is not valid TOML.
    Syntax,
    /// A key the schema does not know.
    UnknownField,
    /// A required key is absent.
    MissingField,
    /// A value of the wrong TOML type, or out of the type's range.
    Type,
    /// A well-typed value that breaks a rule (range, relation to another field,
    /// unreadable secret file, ...).
    Value,
}

/// Why a configuration was rejected. `Display` is a single line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The configuration file itself could not be read.
    #[error("{}: cannot read configuration file: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A problem at a place in the file, e.g.
    /// `dlcp.toml:12:10: loss.budget: 0.25 exceeds the hard cap 0.10 (allowed: 0.0 ..= 0.10; a budget is a
    /// fraction: write 0.01 or "1%" for 1%)`.
    #[error("{location}: {field}: {message}")]
    Invalid {
        /// Where.
        location: Location,
        /// The dotted field path, e.g. `peers[2].address` (for syntax errors: the
        /// enclosing table, or `(top level)`).
        field: String,
        /// What is wrong, usually ending with `(allowed: ...)`.
        message: String,
        /// The kind of problem.
        kind: ErrorKind,
    },
}

impl ConfigError {
    /// The location, if the error has one.
    pub fn location(&self) -> Option<&Location> {
        match self {
            ConfigError::Invalid { location, .. } => Some(location),
            ConfigError::Read { .. } => None,
        }
    }

    /// The line (1-based), if the error has a location.
    pub fn line(&self) -> Option<usize> {
        self.location().map(|l| l.line)
    }

    /// The dotted field path, if the error is about a field.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            ConfigError::Read { .. } => None,
        }
    }

    /// The message without location and field.
    pub fn message(&self) -> String {
        match self {
            ConfigError::Invalid { message, .. } => message.clone(),
            ConfigError::Read { source, .. } => source.to_string(),
        }
    }

    /// The kind of an `Invalid` error.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            ConfigError::Invalid { kind, .. } => Some(*kind),
            ConfigError::Read { .. } => None,
        }
    }
}

/// Collapse a message onto one line.
pub(crate) fn one_line(s: &str) -> String {
    s.split('\n').map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

/// A serde/toml deserialization message, rewritten into the house style.
pub(crate) struct Rewritten {
    /// The message.
    pub message: String,
    /// For "missing field `x`": `x` (to be appended to the table's path).
    pub missing: Option<String>,
    /// The kind.
    pub kind: ErrorKind,
}

/// Rewrite serde's messages:
/// - ``unknown field `x`, expected one of `a`, `b` `` → `unknown field (allowed: a, b)`
/// - ``unknown variant `x`, expected `a` or `b` `` → `invalid value "x" (allowed: a, b)`
/// - ``missing field `x` `` → `required field is missing`
/// - `invalid type: string "x", expected u32` → `invalid type: string "x" (allowed: an integer 0 ..= 4294967295)`
pub(crate) fn rewrite_serde_message(msg: &str) -> Rewritten {
    let msg = one_line(msg);
    if let Some(rest) = msg.strip_prefix("unknown field ") {
        let allowed = rest.split_once(", ").map_or("none", |(_, e)| e);
        let allowed =
            if allowed.starts_with("there are no fields") { "none".to_owned() } else { list(allowed) };
        return Rewritten {
            message: format!("unknown field (allowed: {allowed})"),
            missing: None,
            kind: ErrorKind::UnknownField,
        };
    }
    if let Some(rest) = msg.strip_prefix("unknown variant ") {
        let (value, allowed) = rest.split_once(", ").unwrap_or((rest, ""));
        let value = value.trim_matches('`');
        return Rewritten {
            message: format!("invalid value {value:?} (allowed: {})", list(allowed)),
            missing: None,
            kind: ErrorKind::Value,
        };
    }
    if let Some(rest) = msg.strip_prefix("missing field ") {
        return Rewritten {
            message: "required field is missing".to_owned(),
            missing: Some(rest.trim_matches('`').to_owned()),
            kind: ErrorKind::MissingField,
        };
    }
    if msg.contains("(allowed: ") {
        // Our own deserializers already speak the house style.
        return Rewritten { message: msg, missing: None, kind: ErrorKind::Value };
    }
    if let Some(i) = msg.rfind(", expected ") {
        let what = msg[..i].replacen("invalid value: integer ", "invalid value ", 1);
        let what = what.replacen("invalid value: floating point ", "invalid value ", 1).replace('`', "");
        let expected = friendly(&msg[i + ", expected ".len()..]);
        return Rewritten {
            message: format!("{what} (allowed: {expected})"),
            missing: None,
            kind: ErrorKind::Type,
        };
    }
    Rewritten { message: msg, missing: None, kind: ErrorKind::Type }
}

/// "one of `a`, `b`" / "`a` or `b`" / "`a`" → "a, b".
fn list(s: &str) -> String {
    let s = s.strip_prefix("expected ").unwrap_or(s);
    let s = s.strip_prefix("one of ").unwrap_or(s);
    s.replace("` or `", "`, `").replace('`', "")
}

/// Rust type names in serde messages → what a config author would write.
fn friendly(expected: &str) -> String {
    let s = match expected {
        "u8" => "an integer 0 ..= 255",
        "u16" => "an integer 0 ..= 65535",
        "u32" => "an integer 0 ..= 4294967295",
        "u64" => "an integer 0 ..= 18446744073709551615",
        "i64" => "an integer",
        "f64" | "f32" => "a number",
        "a boolean" => "true or false",
        "a sequence" => "an array",
        "a string" => "a string",
        "path string" => "a path string",
        other if other.starts_with("struct ") => "a table",
        other if other.starts_with("enum ") => "a string",
        other => other,
    };
    s.to_owned()
}

/// A validation failure before it is located in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bad {
    /// Dotted path of the offending field.
    pub path: String,
    /// The message.
    pub message: String,
}

impl Bad {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Bad {
        Bad { path: path.into(), message: message.into() }
    }
}

/// Build an `Invalid` error at a byte span of `text`.
pub(crate) fn invalid_at(
    file: &str,
    text: &str,
    span: Option<Range<usize>>,
    field: String,
    message: String,
    kind: ErrorKind,
) -> ConfigError {
    let location = Location::at(file, text, span.map_or(0, |s| s.start));
    ConfigError::Invalid { location, field, message, kind }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_counts_lines_and_chars() {
        let t = "a = 1\nbé = 2\n";
        assert_eq!(Location::at("f", t, 0), Location { file: "f".into(), line: 1, column: 1 });
        let i = t.find('=').unwrap();
        assert_eq!(Location::at("f", t, i).column, 3);
        let j = t.rfind('=').unwrap();
        assert_eq!((Location::at("f", t, j).line, Location::at("f", t, j).column), (2, 4));
        assert_eq!(Location::at("f", t, 999).line, 3);
    }

    #[test]
    fn rewrites() {
        let r = rewrite_serde_message("unknown field `mtuu`, expected one of `mtu`, `kind`");
        assert_eq!(
            (r.message.as_str(), r.kind),
            ("unknown field (allowed: mtu, kind)", ErrorKind::UnknownField)
        );
        let r = rewrite_serde_message("unknown field `x`, there are no fields");
        assert_eq!(r.message, "unknown field (allowed: none)");
        let r = rewrite_serde_message("unknown variant `dpkd`, expected one of `auto`, `socket`, `dpdk`");
        assert_eq!(r.message, "invalid value \"dpkd\" (allowed: auto, socket, dpdk)");
        let r = rewrite_serde_message("unknown variant `x`, expected `zero` or `local`");
        assert_eq!(r.message, "invalid value \"x\" (allowed: zero, local)");
        let r = rewrite_serde_message("missing field `rank`");
        assert_eq!(r.missing.as_deref(), Some("rank"));
        let r = rewrite_serde_message("invalid type: string \"x\", expected u32");
        assert_eq!(r.message, "invalid type: string \"x\" (allowed: an integer 0 ..= 4294967295)");
        let r = rewrite_serde_message("invalid value: integer `300`, expected u8");
        assert_eq!(r.message, "invalid value 300 (allowed: an integer 0 ..= 255)");
        let r = rewrite_serde_message("invalid type: integer `5`, expected a string");
        assert_eq!(r.message, "invalid type: integer 5 (allowed: a string)");
        let r = rewrite_serde_message("invalid length 2, expected an array of length 3");
        assert_eq!(r.message, "invalid length 2 (allowed: an array of length 3)");
    }
}
