//! The command line against what the docs tell users to type.

use super::*;

/// The `dpctl …` commands in backticks of `text` (a comment's lines joined), one per piped or
/// chained part, as words: `[x]` is x, `a|b` is a, `…` is left out.
fn quoted_commands(text: &str) -> Vec<Vec<String>> {
    let text = text.replace("\n# ", " ").replace("\n#", " ");
    let spans = text.split('`').skip(1).step_by(2);
    let parts = spans.flat_map(|span| span.split(" && ").flat_map(|p| p.split(" | ")).collect::<Vec<_>>());
    parts
        .filter(|part| part.starts_with("dpctl "))
        .map(|part| {
            part.split_whitespace()
                .filter(|word| *word != "…")
                .map(|word| word.trim_matches(['[', ']']).split('|').next().unwrap_or_default().to_owned())
                .collect()
        })
        .collect()
}

/// Whether clap's refusal is only the docs abbreviating (a required value left out, a flag
/// named without its value, a placeholder such as `E` for a number), not a command or flag that
/// does not exist.
fn abbreviated(error: &clap::Error, words: &[String]) -> bool {
    use clap::error::{ContextKind, ContextValue, ErrorKind::*};
    let flag_last = words.last().is_some_and(|w| w.starts_with("--"));
    let placeholder = match error.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(value)) => value.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
        _ => false,
    };
    match error.kind() {
        MissingRequiredArgument | MissingSubcommand | DisplayHelp | DisplayHelpOnMissingArgumentOrSubcommand => true,
        InvalidValue | ValueValidation => flag_last || placeholder,
        _ => false,
    }
}

#[test]
fn every_dpctl_command_the_docs_and_job_files_quote_is_one_dpctl_parses() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = vec![root.join("README.md"), root.join("helm/dpcap/templates/NOTES.txt")];
    for dir in ["docs", "deploy/jobs"] {
        let entries = std::fs::read_dir(root.join(dir)).unwrap();
        files.extend(entries.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e != "json")));
    }
    let mut checked = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for words in quoted_commands(&text) {
            if let Err(e) = command(None, &words).try_get_matches_from(&words)
                && !abbreviated(&e, &words)
            {
                panic!("{}: `{}` does not parse: {e}", file.display(), words.join(" "));
            }
            checked += 1;
        }
    }
    assert!(checked > 40, "only {checked} quoted commands found");
}

#[test]
fn a_quoted_command_is_read_across_comment_lines_and_alternatives() {
    let quoted = quoted_commands("# run `dpctl budget set\n# --allow-not-private` and `dpctl a|b [--c] … | head`");
    assert_eq!(quoted, [vec!["dpctl", "budget", "set", "--allow-not-private"], vec!["dpctl", "a", "--c"]]);
}

#[test]
fn the_offline_commands_are_known_through_the_global_flags_before_them() {
    let args = |line: &str| line.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    assert!(offline(&args("dpctl --context lab privacy epsilon --steps 3")));
    assert!(offline(&args("dpctl dataset index ./d")));
    assert!(!offline(&args("dpctl dataset budget set ./d")));
    assert!(!offline(&args("dpctl --coordinator privacy get job-1")), "a flag's value is not a command");
}
