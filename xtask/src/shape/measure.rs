//! Measures one Rust source file for `cargo xtask shape`: its lines of code (every line outside
//! `#[cfg(test)]` modules) and the length of each function outside them, from its `fn` line to
//! its closing brace. A brace-depth scan over [`lex::tokens`](super::lex::tokens): closures and
//! blocks stay inside their function; a function nested in another is measured on its own too.

use super::lex::{Spanned, Token, tokens};

/// One function and its length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FnSpan {
    /// Its name.
    pub name: String,
    /// The line of its `fn` keyword, 1-based.
    pub line: usize,
    /// Lines from the `fn` line to the closing brace, both included.
    pub lines: usize,
}

/// What [`measure`] found in one file.
#[derive(Debug, Default)]
pub struct Shape {
    /// Lines outside `#[cfg(test)]` modules (blank and comment lines included).
    pub code_lines: usize,
    /// Every function with a body outside `#[cfg(test)]` modules, in source order of their ends.
    pub fns: Vec<FnSpan>,
    /// Out-of-line test modules: `NAME` of each `#[cfg(test)] mod NAME;`.
    pub test_modules: Vec<String>,
}

/// What an open brace belongs to.
#[derive(Debug)]
enum Open {
    Fn { name: String, line: usize },
    TestMod { line: usize },
    Other,
}

/// A `fn NAME` whose body has not opened yet, at a given `(`/`[` depth.
#[derive(Debug)]
struct PendingFn {
    name: String,
    line: usize,
    depth: usize,
}

#[derive(Debug, Default)]
struct Scan {
    stack: Vec<Open>,
    /// `(`/`[` nesting, so `;` and `{` inside a signature (`[u8; 4]`, a struct pattern) do not
    /// end or open the body.
    depth: usize,
    pending_fn: Option<PendingFn>,
    /// The line of a `#[cfg(test)]` not yet followed by its item.
    pending_test: Option<usize>,
    /// `#[cfg(test)] mod NAME` seen, its body not opened yet: the attribute's line and NAME.
    pending_test_mod: Option<(usize, String)>,
    /// Line ranges of test modules.
    test_ranges: Vec<(usize, usize)>,
    shape: Shape,
}

/// Measures `src`.
pub fn measure(src: &str) -> Shape {
    let toks = tokens(src);
    let mut scan = Scan::default();
    let mut i = 0;
    while i < toks.len() {
        i = scan.step(&toks, i);
    }
    let total = src.lines().count();
    let mut in_test = vec![false; total + 1];
    for &(from, to) in &scan.test_ranges {
        if let Some(lines) = in_test.get_mut(from..=to.min(total)) {
            lines.fill(true);
        }
    }
    scan.shape.code_lines = (1..=total).filter(|&l| !in_test[l]).count();
    scan.shape
}

fn word(toks: &[Spanned], i: usize) -> Option<&str> {
    match toks.get(i).map(|t| &t.token) {
        Some(Token::Word(w)) => Some(w),
        _ => None,
    }
}

fn punct(toks: &[Spanned], i: usize) -> Option<char> {
    match toks.get(i).map(|t| &t.token) {
        Some(Token::Punct(c)) => Some(*c),
        _ => None,
    }
}

/// For an attribute starting at `i` (`#[...]` or `#![...]`): the index after its `]` and whether
/// it is exactly `cfg(test)`.
fn attribute(toks: &[Spanned], i: usize) -> Option<(usize, bool)> {
    let open = if punct(toks, i + 1) == Some('!') {
        i + 2
    } else {
        i + 1
    };
    if punct(toks, open) != Some('[') {
        return None;
    }
    let mut depth = 0usize;
    for end in open..toks.len() {
        match punct(toks, end) {
            Some('[') => depth += 1,
            Some(']') => {
                depth -= 1;
                if depth == 0 {
                    let inner: Vec<&Token> = toks[open + 1..end].iter().map(|t| &t.token).collect();
                    let is_test = matches!(
                        inner.as_slice(),
                        [Token::Word(cfg), Token::Punct('('), Token::Word(test), Token::Punct(')')]
                            if cfg == "cfg" && test == "test"
                    );
                    return Some((end + 1, is_test));
                }
            }
            _ => {}
        }
    }
    None
}

impl Scan {
    /// Handles the token at `i`; returns the index of the next one to handle.
    fn step(&mut self, toks: &[Spanned], i: usize) -> usize {
        let line = toks[i].line;
        match &toks[i].token {
            Token::Punct('#') => {
                if let Some((next, is_test)) = attribute(toks, i) {
                    if is_test {
                        self.pending_test = Some(line);
                    }
                    return next;
                }
            }
            Token::Word(w) if w == "fn" => {
                if let Some(name) = word(toks, i + 1) {
                    self.pending_fn = Some(PendingFn {
                        name: name.to_string(),
                        line,
                        depth: self.depth,
                    });
                    return i + 2;
                }
            }
            Token::Word(w) if w == "mod" => {
                if let (Some(attr_line), Some(name)) = (self.pending_test, word(toks, i + 1)) {
                    self.pending_test_mod = Some((attr_line, name.to_string()));
                    return i + 2;
                }
            }
            Token::Punct('(' | '[') => self.depth += 1,
            Token::Punct(')' | ']') => self.depth = self.depth.saturating_sub(1),
            Token::Punct(';') => self.semicolon(),
            Token::Punct('{') => self.open(),
            Token::Punct('}') => self.close(line),
            _ => {}
        }
        i + 1
    }

    fn at_signature_depth(&self) -> bool {
        self.pending_fn
            .as_ref()
            .is_some_and(|f| f.depth == self.depth)
    }

    fn semicolon(&mut self) {
        if self.at_signature_depth() {
            // a declaration without a body (trait method, extern fn)
            self.pending_fn = None;
        }
        if let Some((_, name)) = self.pending_test_mod.take() {
            self.shape.test_modules.push(name);
        }
        self.pending_test = None;
    }

    fn open(&mut self) {
        let open = if let Some((attr_line, _)) = self.pending_test_mod.take() {
            Open::TestMod { line: attr_line }
        } else {
            match self.pending_fn.take() {
                Some(f) if f.depth == self.depth => Open::Fn {
                    name: f.name,
                    line: f.line,
                },
                other => {
                    self.pending_fn = other;
                    Open::Other
                }
            }
        };
        self.pending_test = None;
        self.stack.push(open);
    }

    fn close(&mut self, close_line: usize) {
        match self.stack.pop() {
            Some(Open::Fn { name, line }) => {
                let in_test = self.stack.iter().any(|o| matches!(o, Open::TestMod { .. }));
                if !in_test {
                    self.shape.fns.push(FnSpan {
                        name,
                        line,
                        lines: close_line - line + 1,
                    });
                }
            }
            Some(Open::TestMod { line }) => self.test_ranges.push((line, close_line)),
            Some(Open::Other) | None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(src: &str, name: &str) -> Option<FnSpan> {
        measure(src).fns.into_iter().find(|f| f.name == name)
    }

    #[test]
    fn a_three_line_fn_is_three_lines() {
        let src = "// a comment\nfn three() {\n    body();\n}\n";
        let three = span(src, "three").unwrap();
        assert_eq!((three.line, three.lines), (2, 3));
        assert_eq!(measure(src).code_lines, 4);
    }

    #[test]
    fn a_nested_closure_is_inside_its_fn_and_no_fn_of_its_own() {
        let src = "impl X {\n    pub fn outer<'a>(&'a self) -> impl Fn() + 'a {\n        let f = |x: u8| {\n            x + 1\n        };\n        move || { f(1); }\n    }\n}\n";
        let shape = measure(src);
        assert_eq!(
            shape.fns,
            vec![FnSpan {
                name: "outer".into(),
                line: 2,
                lines: 6
            }]
        );
    }

    #[test]
    fn test_modules_are_not_code() {
        let src = "fn a() {}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {\n        assert!(true);\n    }\n}\n#[cfg(test)]\nmod more;\n";
        let shape = measure(src);
        assert_eq!(shape.code_lines, 4, "fn a, the blank line and `mod more`");
        assert_eq!(shape.fns.len(), 1);
        assert_eq!(shape.fns[0].name, "a");
        assert_eq!(shape.test_modules, vec!["more".to_string()]);
    }

    #[test]
    fn braces_in_strings_chars_and_comments_are_ignored() {
        let src = "fn f() -> String {\n    let a = \"}}}\";\n    let b = '}';\n    // }\n    /* } */\n    let c = r#\"}\"#;\n    format!(\"{a}{b}{c}\")\n}\nfn g() {}\n";
        assert_eq!(span(src, "f").unwrap().lines, 8);
        assert_eq!(span(src, "g").unwrap().line, 9);
    }

    #[test]
    fn declarations_without_bodies_and_fn_pointers_are_no_fns() {
        let src = "trait T {\n    fn decl(&self, x: [u8; 4]);\n    fn with_body(&self) {}\n}\ntype F = fn(u8) -> u8;\nfn pattern(P { x }: P) {\n}\n";
        let names: Vec<(String, usize)> = measure(src)
            .fns
            .into_iter()
            .map(|f| (f.name, f.lines))
            .collect();
        assert_eq!(names, vec![("with_body".into(), 1), ("pattern".into(), 2)]);
    }

    #[test]
    fn a_long_fn_is_measured_whole() {
        let body = "    step();\n".repeat(100);
        let src = format!("fn short() {{}}\n\nfn long() {{\n{body}}}\n");
        assert_eq!(
            span(&src, "long"),
            Some(FnSpan {
                name: "long".into(),
                line: 3,
                lines: 102
            })
        );
    }
}
