//! The contract is stated in one place, core's docs: the event clauses in
//! the crate docs (`src/lib.rs`), the task clauses in the `task` module
//! docs (`src/task/mod.rs`), each one a `**Cn ` or `**Tn ` bullet. Every
//! other mention of the whole range in the repository ("C1 to C<n>", "T1 to
//! T<n>", in docs, READMEs and test comments, across a line break too) must
//! name the newest clause, so a new clause cannot leave stale ranges behind.
//! The CHANGELOG is history and keeps the ranges of its day.

use std::path::{Path, PathBuf};

/// The numbers of the clauses `prefix` (`C` or `T`) that `text` defines as
/// `**<prefix><n> ` bullets.
fn defined(text: &str, prefix: char) -> Vec<u32> {
    let marker = format!("**{prefix}");
    text.match_indices(&marker)
        .filter_map(|(at, _)| {
            let rest = &text[at + marker.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let after = rest[digits.len()..].chars().next();
            (after == Some(' ')).then(|| digits.parse().ok()).flatten()
        })
        .collect()
}

/// `text` with every line break, and the comment markers and indentation
/// after it, as one space: so that a range split over two lines reads as
/// one.
fn flattened(text: &str) -> String {
    text.lines()
        .map(|line| {
            line.trim_start()
                .trim_start_matches("//!")
                .trim_start_matches("///")
                .trim_start_matches("//")
                .trim()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every `<prefix>1 to <prefix><n>` in `text`: the `n`s.
fn ranges(text: &str, prefix: char) -> Vec<u32> {
    let start = format!("{prefix}1 to {prefix}");
    text.match_indices(&start)
        .filter(|(at, _)| {
            // Not the tail of a longer word or number ("XC1 to C19").
            !text[..*at].ends_with(|c: char| c.is_ascii_alphanumeric())
        })
        .filter_map(|(at, _)| {
            let digits: String = text[at + start.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .collect()
}

fn files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" {
                files(&path, found);
            }
        } else if (name.ends_with(".rs") || name.ends_with(".md")) && name != "CHANGELOG.md" {
            found.push(path);
        }
    }
}

/// The newest clause `prefix` defines in `source`, checking that the
/// clauses run from 1 without a gap.
fn newest(source: &str, prefix: char) -> u32 {
    let mut numbers = defined(source, prefix);
    numbers.sort_unstable();
    numbers.dedup();
    let expected: Vec<u32> = (1..=numbers.len() as u32).collect();
    assert_eq!(
        numbers, expected,
        "the {prefix} clauses run from 1 without a gap"
    );
    *numbers.last().unwrap()
}

#[test]
fn every_range_quoted_names_the_newest_clause() {
    let core = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(core.join(path)).unwrap();
    let events = newest(&read("src/lib.rs"), 'C');
    let tasks = newest(&read("src/task/mod.rs"), 'T');
    let mut found = Vec::new();
    files(core.parent().unwrap(), &mut found);
    assert!(found.len() > 50, "the repository's files: {}", found.len());
    let mut stale = Vec::new();
    let mut quoted = 0;
    for path in found {
        let text = flattened(&std::fs::read_to_string(&path).unwrap());
        for (prefix, newest) in [('C', events), ('T', tasks)] {
            for end in ranges(&text, prefix) {
                quoted += 1;
                if end != newest {
                    stale.push(format!(
                        "{}: {prefix}1 to {prefix}{end} (the contract ends at {prefix}{newest})",
                        path.display()
                    ));
                }
            }
        }
    }
    assert!(quoted > 5, "the scan finds the ranges the docs quote");
    assert!(
        stale.is_empty(),
        "stale clause ranges:\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_scan_reads_ranges_across_lines_and_comments() {
    // Built at run time, so that the scan of this file does not read the
    // sample as a range of its own.
    let sample = format!("//! clauses T1\n//! to T19, and C1 to C{}; XC1 to C2", 19);
    let text = flattened(&sample);
    assert_eq!(ranges(&text, 'T'), [19]);
    assert_eq!(ranges(&text, 'C'), [19]);
    assert_eq!(defined("* **C1 One.**\n* **C2 Two.** **C10x", 'C'), [1, 2]);
}
