//! The README's quick starts, as programs CI builds: `lan` (UDP multicast on one network) and
//! `cloud` (the TCP mesh from a seed list). The README quotes them whole; a test keeps the two
//! the same.

#[cfg(test)]
mod tests {
    /// Every quick start appears in the README exactly as it is here.
    #[test]
    fn the_readme_quotes_the_quick_starts_verbatim() {
        let readme = include_str!("../../README.md");
        for (name, program) in [
            ("lan", include_str!("bin/lan.rs")),
            ("cloud", include_str!("bin/cloud.rs")),
        ] {
            assert!(
                readme.contains(program),
                "README.md does not quote quickstart/src/bin/{name}.rs as it is"
            );
        }
    }
}
