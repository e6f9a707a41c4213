//! The file of `posgate terminals import` and `export`: CSV with the exact header
//! `id,addr,server_name` or `id,addr,server_name,labels`, one terminal per line,
//! `server_name` possibly empty (it then defaults to the host of `addr`), `labels` the
//! terminal's [`Labels`] as `key=value;key=value` (possibly empty: none). [`write()`]
//! produces what [`parse`] reads back unchanged; it writes the `labels` column only when
//! a terminal has labels, so a file without any still imports with a previous release
//! (which refuses the four-column header rather than drop the labels).
//!
//! Every line is checked before anything is imported: [`parse`] returns either all
//! terminals or every bad line with its 1-based line number (the header is line 1).
//! Fields may be quoted (`"a"`, with `""` for a quote) and are trimmed of surrounding
//! spaces; blank lines are skipped; a UTF-8 byte order mark and `\r\n` line ends are
//! accepted. Valid values never contain commas, quotes or line breaks, so a field
//! spanning lines is an error.
//!
//! What it does not do: read or write the file, or talk to a store.

use std::collections::HashMap;
use std::fmt;

use super::{Shown, Terminal};
use crate::api::Labels;

/// The first line of a file without labels.
pub const HEADER: &str = "id,addr,server_name";
/// The first line of a file with labels.
pub const LABELED_HEADER: &str = "id,addr,server_name,labels";

/// One rejected line.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LineError {
    /// 1-based; the header is line 1.
    pub line: usize,
    pub reason: String,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.line, self.reason)
    }
}

/// Splits one CSV line into fields (RFC 4180 quoting, no embedded line breaks).
fn fields(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek() == Some(&' ') || chars.peek() == Some(&'\t') {
            chars.next();
        }
        let mut field = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => field.push(c),
                    None => return Err("unterminated quoted field".to_string()),
                }
            }
            while chars.peek() == Some(&' ') || chars.peek() == Some(&'\t') {
                chars.next();
            }
            match chars.peek() {
                None | Some(',') => {}
                Some(_) => return Err("text after a closing quote".to_string()),
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' {
                    break;
                }
                if c == '"' {
                    return Err("a quote inside an unquoted field".to_string());
                }
                field.push(c);
                chars.next();
            }
            field.truncate(field.trim_end().len());
        }
        out.push(field);
        match chars.next() {
            Some(',') => continue,
            None => return Ok(out),
            Some(_) => unreachable!("fields end at a comma or the line end"),
        }
    }
}

/// `terminals` as an import file: the header, then one line per terminal in the order
/// given, every field written out (an explicit `server_name`). A field that would not
/// read back as itself (a comma, a quote, a line break, surrounding spaces: only a
/// directory edited behind posgate's back has one) is quoted, with a line break written
/// as `\n` or `\r` (files have one line per terminal), so the file stays well formed and
/// `import` names that line instead of misreading the next ones.
pub fn write(terminals: &[Terminal]) -> String {
    let labeled = terminals.iter().any(|t| !t.labels.is_empty());
    let mut out = String::with_capacity(LABELED_HEADER.len() + 1 + terminals.len() * 64);
    out.push_str(if labeled { LABELED_HEADER } else { HEADER });
    out.push('\n');
    for t in terminals {
        let labels = t.labels.to_string();
        let fields = [&t.id, &t.addr, &t.server_name, &labels];
        let fields = if labeled { &fields[..] } else { &fields[..3] };
        for (i, &value) in fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let plain = !value.contains([',', '"', '\n', '\r']) && value.trim() == value;
            if plain {
                out.push_str(value);
            } else {
                out.push('"');
                let escaped = value
                    .replace('"', "\"\"")
                    .replace('\n', "\\n")
                    .replace('\r', "\\r");
                out.push_str(&escaped);
                out.push('"');
            }
        }
        out.push('\n');
    }
    out
}

/// Whether `text` has the `labels` column: without it, the file says nothing about
/// labels, and an import keeps the ones stored
/// ([`DirectoryAdmin::with_stored_labels`](super::DirectoryAdmin::with_stored_labels)).
pub fn labeled(text: &str) -> bool {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.lines().next().map(str::trim) == Some(LABELED_HEADER)
}

/// Every terminal of `text`, or every bad line (sorted by line). Duplicate ids are bad
/// lines (the later ones, naming the first).
pub fn parse(text: &str) -> Result<Vec<Terminal>, Vec<LineError>> {
    parse_within(text, |_| true)
}

/// [`parse`], where a terminal whose id `allows` refuses (a directory token's patterns)
/// is a bad line too.
pub fn parse_within(
    text: &str,
    allows: impl Fn(&str) -> bool,
) -> Result<Vec<Terminal>, Vec<LineError>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.lines().enumerate();
    let mut errors = Vec::new();
    let header = lines.next().map(|(_, l)| l.trim_end_matches('\r'));
    let labeled = match header.map(str::trim) {
        Some(HEADER) => false,
        Some(LABELED_HEADER) => true,
        _ => {
            errors.push(LineError {
                line: 1,
                reason: format!(
                    "expected the header {HEADER:?} or {LABELED_HEADER:?}, got {}",
                    Shown::new(header.unwrap_or(""))
                ),
            });
            return Err(errors);
        }
    };
    let expected = if labeled { LABELED_HEADER } else { HEADER };
    let mut terminals = Vec::new();
    let mut first_line: HashMap<String, usize> = HashMap::new();
    for (index, raw) in lines {
        let number = index + 1;
        let raw = raw.trim_end_matches('\r');
        if raw.trim().is_empty() {
            continue;
        }
        let mut fail = |reason: String| {
            errors.push(LineError {
                line: number,
                reason,
            })
        };
        let parts = match fields(raw) {
            Ok(parts) => parts,
            Err(reason) => {
                fail(reason);
                continue;
            }
        };
        let (id, addr, server_name, labels) = match parts.as_slice() {
            [id, addr, server_name] if !labeled => (id, addr, server_name, ""),
            [id, addr, server_name, labels] if labeled => (id, addr, server_name, &labels[..]),
            _ => {
                fail(format!(
                    "expected {} fields ({expected}), got {}",
                    expected.split(',').count(),
                    parts.len()
                ));
                continue;
            }
        };
        let labels = match Labels::parse(labels) {
            Ok(labels) => labels,
            Err(reason) => {
                fail(reason);
                continue;
            }
        };
        match Terminal::new(id, addr, Some(server_name)).map(|t| t.with_labels(labels)) {
            Ok(t) if !allows(&t.id) => {
                fail(format!(
                    "terminal {:?} is outside this token's patterns",
                    t.id
                ));
            }
            Ok(t) => {
                if let Some(first) = first_line.get(&t.id) {
                    fail(format!("duplicate id {:?} (first on line {first})", t.id));
                    continue;
                }
                first_line.insert(t.id.clone(), number);
                terminals.push(t);
            }
            Err(e) => fail(e.to_string()),
        }
    }
    if errors.is_empty() {
        Ok(terminals)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_reads_back_unchanged() {
        let text = "id,addr,server_name\n\
                    pos-1,10.0.0.1:443,\n\
                    pos-2,[::1]:8443,pos-2.example\n";
        let terminals = parse(text).unwrap();
        let written = write(&terminals);
        assert_eq!(
            written,
            "id,addr,server_name\npos-1,10.0.0.1:443,10.0.0.1\npos-2,[::1]:8443,pos-2.example\n"
        );
        assert_eq!(parse(&written).unwrap(), terminals);
        // A value no valid terminal has (edited in Redis by hand) keeps the file's shape:
        // the line is refused on import, the others read as they were.
        let odd = Terminal {
            id: "odd".into(),
            addr: "h:1, \"x\"\nid".into(),
            server_name: " h".into(),
            labels: Default::default(),
        };
        let written = write(&[terminals[0].clone(), odd, terminals[1].clone()]);
        let errors = parse(&written).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].line, 3);
    }

    #[test]
    fn good_file() {
        let text = "\u{feff}id,addr,server_name\r\n\
                    pos-1,10.0.0.1:443,pos-1.example\r\n\
                    \r\n\
                    \"pos-2\", [::1]:8443 ,\r\n\
                    pos-3,pos-3.example:443,\n";
        let ts = parse(text).unwrap();
        assert_eq!(ts.len(), 3);
        assert_eq!(ts[0].server_name, "pos-1.example");
        assert_eq!(ts[1].id, "pos-2");
        assert_eq!(ts[1].addr, "[::1]:8443");
        assert_eq!(ts[1].server_name, "::1");
        assert_eq!(ts[2].server_name, "pos-3.example");
    }

    #[test]
    fn every_bad_line_is_reported() {
        let text = "id,addr,server_name\n\
                    ok-1,h:1,\n\
                    bad id,h:1,\n\
                    ok-2,h:0,\n\
                    ok-1,h:2,\n\
                    ok-3,h:3\n\
                    ok-4,\"h:4,\n\
                    ok-5,h:5,bad name\n";
        let errors = parse(text).unwrap_err();
        let lines: Vec<usize> = errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![3, 4, 5, 6, 7, 8], "{errors:?}");
        assert!(errors[2].reason.contains("first on line 2"), "{errors:?}");
    }

    #[test]
    fn a_huge_bad_value_is_named_not_echoed() {
        let huge = "x".repeat(1 << 20);
        for text in [
            format!("id,addr,server_name\n{huge},h:1,\n"),
            format!("id,addr,server_name\nok,{huge},\n"),
            format!("id,addr,server_name\nok,h:1,{huge}\n"),
            format!("{huge}\n"),
        ] {
            let errors = parse(&text).unwrap_err();
            let shown = errors[0].to_string();
            assert!(
                shown.len() < 300,
                "{} bytes: {}...",
                shown.len(),
                &shown[..300]
            );
            assert!(shown.contains("(1048576 bytes in all)"), "{shown}");
        }
        // A multi-byte character at the cut is not split.
        let wide = "\u{e9}".repeat(80);
        let shown = Shown::new(&wide).to_string();
        assert!(
            shown.starts_with(&format!("{:?}", "\u{e9}".repeat(50))),
            "{shown}"
        );
        assert!(shown.ends_with("... (160 bytes in all)"), "{shown}");
        // Control bytes escape to six characters each: the cut counts what is shown
        // (the fuzz target terminals_csv found a 158-byte value shown in 631).
        let control = "\u{10}".repeat(150);
        let shown = Shown::new(&control).to_string();
        assert!(
            shown.len() <= super::super::SHOWN_BYTES + 30,
            "{} bytes: {shown}",
            shown.len()
        );
        assert!(shown.starts_with("\"\\u{10}"), "{shown}");
        assert!(shown.ends_with("... (150 bytes in all)"), "{shown}");
    }

    #[test]
    fn labels_are_a_fourth_column() {
        let text = "id,addr,server_name,labels\n\
                    pos-1,10.0.0.1:443,,store=17;region=eu\n\
                    pos-2,10.0.0.2:443,,\n";
        let terminals = parse(text).unwrap();
        assert_eq!(terminals[0].labels.get("store"), Some("17"));
        assert!(terminals[1].labels.is_empty());
        let written = write(&terminals);
        assert_eq!(
            written,
            "id,addr,server_name,labels\n\
             pos-1,10.0.0.1:443,10.0.0.1,region=eu;store=17\n\
             pos-2,10.0.0.2:443,10.0.0.2,\n"
        );
        assert_eq!(parse(&written).unwrap(), terminals);
        // Without labels, the file a previous release reads.
        assert!(write(&terminals[1..]).starts_with("id,addr,server_name\n"));
        assert!(labeled(text) && labeled(&written) && !labeled(&write(&terminals[1..])));
        let errors = parse(
            "id,addr,server_name,labels\n\
             a,h:1,,store\n\
             b,h:1,\n\
             c,h:1,,x=1;x=2\n",
        )
        .unwrap_err();
        let lines: Vec<usize> = errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![2, 3, 4], "{errors:?}");
        assert!(errors[0].reason.contains("not key=value"), "{errors:?}");
        assert!(errors[1].reason.contains("expected 4 fields"), "{errors:?}");
        // A labels column in a three-column file is an extra field, not labels.
        let errors = parse("id,addr,server_name\na,h:1,,store=1\n").unwrap_err();
        assert!(errors[0].reason.contains("expected 3 fields"), "{errors:?}");
    }

    #[test]
    fn header_is_required() {
        assert_eq!(parse("").unwrap_err()[0].line, 1);
        assert_eq!(parse("id,addr\na,h:1\n").unwrap_err()[0].line, 1);
        assert!(parse("id,addr,server_name\n").unwrap().is_empty());
    }
}
