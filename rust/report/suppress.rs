//! Suppression files (`suppressions=FILE`), as LeakSanitizer users write them: one rule a line,
//! `leak:PATTERN` or `<error kind>:PATTERN` (`double_free:SDL_*`), `#` comments. A pattern is a
//! glob (`*`, `?`) found anywhere in the function, source file or module of any frame of the
//! block's stack; `^` and `$` anchor it at the start and end of the name.

use crate::symbolize::glob::matches;
use crate::symbolize::Frame;

/// One rule: what it applies to and its pattern, with the line it came from.
#[derive(Clone, Debug)]
pub struct Rule {
    /// `leak`, or an error kind's name.
    pub kind: String,
    pub pattern: String,
    /// As written in the file (`leak:SDL_*`), for the report.
    pub text: String,
}

/// The rules of one file, and the warnings its bad lines gave.
#[derive(Default)]
pub struct Suppressions {
    pub rules: Vec<Rule>,
    pub warnings: Vec<String>,
}

impl Suppressions {
    /// Reads `path` (`suppressions=`); a file that cannot be read gives no rules and a warning.
    pub fn load(path: &str) -> Suppressions {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let kinds = crate::tracker::errors::ErrorKind::ALL.map(|k| k.name());
                Suppressions::parse(path, &text, &kinds)
            }
            Err(e) => Suppressions {
                rules: Vec::new(),
                warnings: vec![format!("suppressions={path}: cannot be read ({e})")],
            },
        }
    }

    /// Parses the rules of `text`; `error_kinds` are the names allowed beside `leak`.
    pub fn parse(path: &str, text: &str, error_kinds: &[&str]) -> Suppressions {
        let mut parsed = Suppressions::default();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let problem = match line.split_once(':') {
                None => Some("expected KIND:PATTERN".to_owned()),
                Some((_, pattern)) if pattern.trim().is_empty() => Some("empty pattern".to_owned()),
                Some((kind, _)) if kind != "leak" && !error_kinds.contains(&kind) => Some(format!(
                    "unknown kind '{kind}' (leak or {})",
                    error_kinds.join(", ")
                )),
                Some((kind, pattern)) => {
                    parsed.rules.push(Rule {
                        kind: kind.to_owned(),
                        pattern: pattern.trim().to_owned(),
                        text: line.to_owned(),
                    });
                    None
                }
            };
            if let Some(problem) = problem {
                parsed.warnings.push(format!(
                    "{path}:{}: {problem} in '{line}', line ignored",
                    number + 1
                ));
            }
        }
        parsed
    }

    /// The first rule of `kind` that matches a frame of `frames`.
    pub fn matching(&self, kind: &str, frames: &[Frame]) -> Option<usize> {
        self.rules.iter().position(|rule| {
            rule.kind == kind
                && frames.iter().any(|f| {
                    [f.function.as_deref(), f.file.as_deref(), Some(&f.module)]
                        .into_iter()
                        .flatten()
                        .any(|name| matches(&rule.pattern, name))
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lines_are_warned_with_their_number() {
        let text =
            "# third-party\nleak:SDL_*\n\nnonsense\nleak:\nbogus_kind:x\ndouble_free:free_twice\n";
        let s = Suppressions::parse("app.supp", text, &["double_free", "invalid_free"]);
        let rules: Vec<&str> = s.rules.iter().map(|r| r.text.as_str()).collect();
        assert_eq!(rules, ["leak:SDL_*", "double_free:free_twice"]);
        assert_eq!(s.warnings.len(), 3, "{:?}", s.warnings);
        assert!(s.warnings[0].starts_with("app.supp:4: expected KIND:PATTERN"));
        assert!(s.warnings[1].starts_with("app.supp:5: empty pattern"));
        assert!(s.warnings[2].starts_with("app.supp:6: unknown kind 'bogus_kind'"));
    }
}
