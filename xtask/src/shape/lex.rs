//! Just enough of a Rust lexer for `cargo xtask shape`: words (identifiers, keywords, numbers) and
//! single punctuation characters, each with its line. Comments (nested block comments included),
//! string literals (plain, byte, C and raw, with any number of `#`), char literals and lifetimes
//! produce no tokens, so the braces inside them are never counted.

/// One token: a word or a punctuation character.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// An identifier, keyword or number (`r#fn` keeps its `r#`, so it is not the keyword).
    Word(String),
    /// Any other character outside comments and literals.
    Punct(char),
}

/// A token and the line (1-based) it starts on.
#[derive(Debug, Clone)]
pub struct Spanned {
    /// The token.
    pub token: Token,
    /// Its line, 1-based.
    pub line: usize,
}

/// The tokens of `src`, in order.
pub fn tokens(src: &str) -> Vec<Spanned> {
    let mut lexer = Lexer {
        chars: src.chars().collect(),
        at: 0,
        line: 1,
        out: Vec::new(),
    };
    lexer.run();
    lexer.out
}

struct Lexer {
    chars: Vec<char>,
    at: usize,
    line: usize,
    out: Vec<Spanned>,
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek(0)?;
        self.at += 1;
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn push(&mut self, token: Token, line: usize) {
        self.out.push(Spanned { token, line });
    }

    fn run(&mut self) {
        while let Some(c) = self.peek(0) {
            match c {
                '/' if self.peek(1) == Some('/') => self.line_comment(),
                '/' if self.peek(1) == Some('*') => self.block_comment(),
                '"' => {
                    self.bump();
                    self.string_body();
                }
                '\'' => self.quote(),
                c if is_word_char(c) => self.word(),
                c if c.is_whitespace() => {
                    self.bump();
                }
                c => {
                    self.push(Token::Punct(c), self.line);
                    self.bump();
                }
            }
        }
    }

    fn line_comment(&mut self) {
        while self.peek(0).is_some_and(|c| c != '\n') {
            self.bump();
        }
    }

    fn block_comment(&mut self) {
        let mut depth = 0usize;
        while let Some(c) = self.bump() {
            match (c, self.peek(0)) {
                ('/', Some('*')) => {
                    self.bump();
                    depth += 1;
                }
                ('*', Some('/')) => {
                    self.bump();
                    depth -= 1;
                    if depth == 0 {
                        return;
                    }
                }
                _ => {}
            }
        }
    }

    /// The rest of a `"..."` literal, after its opening quote.
    fn string_body(&mut self) {
        while let Some(c) = self.bump() {
            match c {
                '\\' => {
                    self.bump();
                }
                '"' => return,
                _ => {}
            }
        }
    }

    /// The rest of a char literal, after its opening quote.
    fn char_body(&mut self) {
        while let Some(c) = self.bump() {
            match c {
                '\\' => {
                    self.bump();
                }
                '\'' | '\n' => return,
                _ => {}
            }
        }
    }

    /// A char literal (`'x'`, `'\n'`, `'{'`) or a lifetime or label (`'a`, `'static`, `'outer:`).
    fn quote(&mut self) {
        self.bump();
        if self.peek(0) == Some('\\') || self.peek(1) == Some('\'') {
            self.char_body();
        } else {
            while self.peek(0).is_some_and(is_word_char) {
                self.bump();
            }
        }
    }

    /// A raw string after its `r`/`br`/`cr` prefix, if one starts here (`#`s, then `"`).
    fn raw_string(&mut self) -> bool {
        let hashes = (0..).take_while(|&i| self.peek(i) == Some('#')).count();
        if self.peek(hashes) != Some('"') {
            return false;
        }
        for _ in 0..=hashes {
            self.bump();
        }
        while let Some(c) = self.bump() {
            if c == '"' && (0..hashes).all(|i| self.peek(i) == Some('#')) {
                for _ in 0..hashes {
                    self.bump();
                }
                return true;
            }
        }
        true
    }

    fn read_word(&mut self) -> String {
        let mut text = String::new();
        while let Some(c) = self.peek(0).filter(|&c| is_word_char(c)) {
            text.push(c);
            self.bump();
        }
        text
    }

    /// A word, or the literal it prefixes (`b"..."`, `b'x'`, `c"..."`, `r#"..."#`, `br"..."`), or a
    /// raw identifier (`r#fn`).
    fn word(&mut self) {
        let line = self.line;
        let text = self.read_word();
        match (text.as_str(), self.peek(0)) {
            ("b" | "c", Some('"')) => {
                self.bump();
                self.string_body();
            }
            ("b", Some('\'')) => {
                self.bump();
                self.char_body();
            }
            ("r" | "br" | "cr", Some('"' | '#')) if self.raw_string() => {}
            ("r", Some('#')) => {
                self.bump();
                let raw = self.read_word();
                self.push(Token::Word(format!("r#{raw}")), line);
            }
            _ => self.push(Token::Word(text), line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words_and_braces(src: &str) -> String {
        tokens(src)
            .into_iter()
            .map(|t| match t.token {
                Token::Word(w) => format!("{w} "),
                Token::Punct(c) => format!("{c} "),
            })
            .collect::<String>()
            .trim_end()
            .to_string()
    }

    #[test]
    fn literals_and_comments_produce_no_tokens() {
        let src = r###"a "}{" b'{' '}' '\'' r#"}"# br"{" /* { /* } */ } */ // }
b"###;
        assert_eq!(words_and_braces(src), "a b");
    }

    #[test]
    fn lifetimes_are_not_char_literals() {
        assert_eq!(
            words_and_braces("fn f<'a>(x: &'a str) -> char { '{' }"),
            "fn f < > ( x : & str ) - > char { }"
        );
        assert_eq!(words_and_braces("'outer: loop {}"), ": loop { }");
    }

    #[test]
    fn raw_identifiers_are_not_keywords_and_lines_are_counted() {
        let tokens = tokens("x\n\"a\nb\"\nr#fn");
        assert_eq!(tokens[1].token, Token::Word("r#fn".into()));
        assert_eq!(tokens[1].line, 4);
    }
}
