//! Mapping between byte spans of the document and dotted field paths.
//!
//! The document is parsed a second time into toml's spanned tree (`DeTable`);
//! a deserialization error's span is mapped to the dotted path of the key or
//! value it falls in, and a validation error's dotted path is mapped back to the
//! span of its value (or, if the key is absent because a default applied, of the
//! nearest table that is present).

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// The spanned document tree.
pub(crate) struct Doc<'i> {
    root: Spanned<DeValue<'i>>,
}

fn contains(span: &Range<usize>, pos: usize) -> bool {
    span.contains(&pos) || (span.is_empty() && span.start == pos)
}

/// One segment of a dotted path.
#[derive(Debug, PartialEq, Eq)]
enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

/// `a.b[2].c` → `[Key a, Key b, Index 2, Key c]`.
fn segments(path: &str) -> Vec<Seg<'_>> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (key, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !key.is_empty() {
            out.push(Seg::Key(key));
        }
        while let Some(r) = rest.strip_prefix('[') {
            let Some(end) = r.find(']') else { break };
            if let Ok(i) = r[..end].parse() {
                out.push(Seg::Index(i));
            }
            rest = &r[end + 1..];
        }
    }
    out
}

impl<'i> Doc<'i> {
    /// Parse `text` into a spanned tree.
    pub(crate) fn parse(text: &'i str) -> Result<Doc<'i>, toml::de::Error> {
        let t = DeTable::parse(text)?;
        let span = t.span();
        Ok(Doc { root: Spanned::new(span, DeValue::Table(t.into_inner())) })
    }

    /// The dotted path of the deepest key or value whose span holds `pos`
    /// (empty string: the top level).
    pub(crate) fn path_at(&self, pos: usize) -> String {
        search(&self.root, "", pos).unwrap_or_default()
    }

    /// The span of the value at `path` or, if absent, of its nearest present
    /// ancestor (`None` if not even the first segment is present).
    pub(crate) fn span_of(&self, path: &str) -> Option<Range<usize>> {
        let mut cur = &self.root;
        let mut best = None;
        for seg in segments(path) {
            let next = match (seg, cur.get_ref()) {
                (Seg::Key(k), DeValue::Table(t)) => t.get(k),
                (Seg::Index(i), DeValue::Array(a)) => a.get(i),
                _ => None,
            };
            match next {
                Some(v) => {
                    cur = v;
                    best = Some(v.span());
                }
                None => break,
            }
        }
        best
    }

    /// True if the exact `path` is present in the document.
    pub(crate) fn has(&self, path: &str) -> bool {
        let mut cur = &self.root;
        for seg in segments(path) {
            let next = match (seg, cur.get_ref()) {
                (Seg::Key(k), DeValue::Table(t)) => t.get(k),
                (Seg::Index(i), DeValue::Array(a)) => a.get(i),
                _ => None,
            };
            match next {
                Some(v) => cur = v,
                None => return false,
            }
        }
        true
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() { key.to_owned() } else { format!("{prefix}.{key}") }
}

fn search(v: &Spanned<DeValue<'_>>, prefix: &str, pos: usize) -> Option<String> {
    match v.get_ref() {
        DeValue::Table(t) => {
            for (k, child) in t.iter() {
                let path = join(prefix, k.get_ref());
                if contains(&k.span(), pos) {
                    return Some(path);
                }
                if let Some(p) = search(child, &path, pos) {
                    return Some(p);
                }
            }
        }
        DeValue::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                if let Some(p) = search(child, &format!("{prefix}[{i}]"), pos) {
                    return Some(p);
                }
            }
        }
        _ => {}
    }
    contains(&v.span(), pos).then(|| prefix.to_owned())
}

/// The name of the table header (`[x.y]` / `[[x]]`) in effect at byte `pos`,
/// found textually (for syntax errors, where there is no tree).
pub(crate) fn enclosing_header(text: &str, pos: usize) -> Option<String> {
    let pos = pos.min(text.len());
    let line_end = text[pos..].find('\n').map_or(text.len(), |i| pos + i);
    text[..line_end].lines().rev().find_map(|l| {
        let l = l.trim();
        let inner = l.strip_prefix("[[").and_then(|r| r.split_once("]]")).map(|(n, _)| n);
        let inner = inner.or_else(|| l.strip_prefix('[').and_then(|r| r.split_once(']')).map(|(n, _)| n));
        inner.map(|n| n.split('.').map(|s| s.trim().trim_matches('"')).collect::<Vec<_>>().join("."))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "[network]\nmtu = 1500\n\n[[peers]]\nrank = 0\n[[peers]]\nrank = 1\naddress = \"x\"\n\n[priority]\ndscp = [1, 2, 3]\n";

    #[test]
    fn segments_parse() {
        assert_eq!(segments("a.b[2].c"), vec![Seg::Key("a"), Seg::Key("b"), Seg::Index(2), Seg::Key("c")]);
        assert_eq!(segments("x[1][2]"), vec![Seg::Key("x"), Seg::Index(1), Seg::Index(2)]);
    }

    #[test]
    fn path_and_span_round_trip() {
        let d = Doc::parse(T).unwrap();
        for path in ["network.mtu", "peers[1].address", "peers[0].rank", "priority.dscp[2]", "priority.dscp"]
        {
            let span = d.span_of(path).unwrap();
            assert!(d.has(path), "{path}");
            // The start of a value maps back to its path (an array's start to the array).
            assert_eq!(d.path_at(span.start), path, "{path}");
        }
        // Absent key: falls back to the nearest table that is present.
        assert_eq!(d.span_of("network.chunk_bytes"), d.span_of("network"));
        assert!(!d.has("network.chunk_bytes"));
        assert_eq!(d.span_of("loss.budget"), None);
        // A key's own span maps to its path.
        assert_eq!(d.path_at(T.find("address").unwrap()), "peers[1].address");
    }

    #[test]
    fn headers() {
        let t = "a = 1\n[x]\nb = 2\n[[y . z]]\nc = = 3\n";
        assert_eq!(enclosing_header(t, 0), None);
        assert_eq!(enclosing_header(t, t.find("b =").unwrap()).as_deref(), Some("x"));
        assert_eq!(enclosing_header(t, t.find("= 3").unwrap()).as_deref(), Some("y.z"));
    }
}
