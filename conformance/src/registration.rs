//! The check both suites run on themselves: every case a file defines is
//! registered by that file's macro, and every file's macro is part of the
//! suite's macro. (A case registered twice would define one test twice,
//! which does not compile.)

use std::collections::HashSet;

/// One suite as its sources show it.
pub(crate) struct Suite<'a> {
    /// The suite's macro (`event_suite`, `task_suite`).
    pub(crate) name: &'a str,
    /// The source of the module that holds the suite's macro.
    pub(crate) module: &'a str,
    /// The prefix of each file's registration macro, before the file's name.
    pub(crate) file_macro: &'a str,
    /// Each case file's name (without `.rs`) and source.
    pub(crate) files: &'a [(&'a str, &'a str)],
    /// The suite's directory under `src/`.
    pub(crate) dir: &'a str,
}

impl Suite<'_> {
    /// Panics, naming what is wrong, unless every file's cases are
    /// registered by its macro, every file's macro runs in the suite, and
    /// every case file on disk is in [`files`](Self::files).
    pub(crate) fn check(&self) {
        let mut all = HashSet::new();
        for (file, source) in self.files {
            let registered = self.registered(file, source);
            let cases = defined(source);
            assert!(!cases.is_empty(), "{file}.rs defines no cases");
            for case in cases {
                assert!(
                    registered.contains(&case),
                    "{file}.rs defines {case} but its {}{file} macro does not register it",
                    self.file_macro
                );
                assert!(all.insert(case.clone()), "{case} is defined twice");
            }
        }

        let suite = &self.module[self
            .module
            .find(&format!("macro_rules! {}", self.name))
            .unwrap_or_else(|| panic!("no {}! macro", self.name))..];
        for (file, _) in self.files {
            assert!(
                suite.contains(&format!("{}{file}!($harness)", self.file_macro)),
                "{}! never runs {file}.rs",
                self.name
            );
        }
        let on_disk = std::fs::read_dir(format!("{}/src/{}", env!("CARGO_MANIFEST_DIR"), self.dir))
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .filter(|name| !["mod.rs", "support.rs"].contains(&name.as_str()))
            .count();
        assert_eq!(
            on_disk,
            self.files.len(),
            "a case file of src/{} is missing from the list",
            self.dir
        );
    }

    /// The identifiers in the file's registration macro.
    fn registered(&self, file: &str, source: &str) -> Vec<String> {
        let start = format!("macro_rules! {}{file} {{", self.file_macro);
        let body = &source[source
            .find(&start)
            .unwrap_or_else(|| panic!("{file}.rs registers no cases"))..];
        body.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|word| !word.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

/// The names of the `pub async fn`s generic over a harness.
fn defined(source: &str) -> Vec<String> {
    source
        .lines()
        .filter_map(|line| line.strip_prefix("pub async fn "))
        .filter(|rest| rest.contains("Harness"))
        .map(|rest| rest.split(['<', '(']).next().unwrap_or_default().to_owned())
        .collect()
}
