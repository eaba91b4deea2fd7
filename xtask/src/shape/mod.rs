//! `cargo xtask shape [--dir DIR]... [--max-file-lines N] [--max-fn-lines N]`: keeps source files
//! and functions small. Every `.rs` file under each `DIR` (recursively; default: the `src` folder
//! of every crate that ships, [`PRODUCT_SRC_DIRS`], relative to the repository root) may have at
//! most N lines of code (default 600) and every function at most N lines (default 80).
//!
//! Tests are aside: the lines of `#[cfg(test)]` modules are not code and their functions are not
//! measured, and files named `tests.rs` or declared as `#[cfg(test)] mod NAME;` are skipped. Every
//! other line counts, blank and comment lines included. A function is measured from its `fn` line
//! to its closing brace (see [`mod@measure`]). Prints each offender as
//! `path:line: fn NAME is N lines (limit 80)` or `path: N lines of code (limit 600)` and fails;
//! otherwise prints one summary line.

mod lex;
mod measure;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::tools::repo_root;
use measure::{FnSpan, Shape, measure};

/// The source folders of the crates that ship (binaries, images, published libraries): what is
/// checked when no `--dir` is given. Tests, the test kit, the demo programs and xtask are aside.
const PRODUCT_SRC_DIRS: [&str; 9] = [
    "crates/ttdp-api/src",
    "crates/ttdp-selector/src",
    "crates/ttdp-kmd-types/src",
    "crates/ttdp-drain/src",
    "crates/ttdp-kmod/src",
    "crates/ttdp-hostprobe/src",
    "crates/ttdp-agent/src",
    "crates/kubectl-tt-driver/src",
    "crates/ttdp-controller/src",
];

const USAGE: &str =
    "usage: cargo xtask shape [--dir DIR]... [--max-file-lines N] [--max-fn-lines N]
  --dir DIR             a source folder to check, recursively, relative to the repository root
                        (repeatable; default: the src folder of every crate that ships)
  --max-file-lines N    lines of code per file, test modules aside (default: 600)
  --max-fn-lines N      lines per function, from `fn` to its closing brace (default: 80)";

/// Parsed `cargo xtask shape` arguments.
#[derive(Debug, PartialEq, Eq)]
struct Args {
    dirs: Vec<String>,
    max_file_lines: usize,
    max_fn_lines: usize,
}

fn parse_args(args: &[String]) -> Result<Args> {
    let mut dirs = Vec::new();
    let (mut max_file_lines, mut max_fn_lines) = (600, 80);
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let mut number = |flag: &str| -> Result<usize> {
            let value = iter
                .next()
                .with_context(|| format!("{flag} needs a number"))?;
            value
                .parse()
                .with_context(|| format!("{flag} {value:?} is not a number"))
        };
        match arg.as_str() {
            "--max-file-lines" => max_file_lines = number(arg)?,
            "--max-fn-lines" => max_fn_lines = number(arg)?,
            "--dir" => dirs.push(iter.next().context("--dir needs a folder")?.clone()),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown shape argument {other:?}\n\n{USAGE}"),
        }
    }
    if dirs.is_empty() {
        dirs = PRODUCT_SRC_DIRS.map(String::from).to_vec();
    }
    Ok(Args {
        dirs,
        max_file_lines,
        max_fn_lines,
    })
}

/// One measured file: its path as printed and its shape.
#[derive(Debug)]
struct Measured {
    shown: PathBuf,
    shape: Shape,
}

/// Entry point of `cargo xtask shape`.
pub fn run(args: &[String]) -> Result<()> {
    let args = parse_args(args)?;
    let root = repo_root()?;
    let mut files = Vec::new();
    for dir in &args.dirs {
        files.extend(measure_dir(&root, Path::new(dir))?);
    }
    let offenders = offenders(&files, &args);
    for offender in &offenders {
        println!("{offender}");
    }
    if !offenders.is_empty() {
        bail!(
            "shape: {} offender(s) in {}",
            offenders.len(),
            args.dirs.join(", ")
        );
    }
    println!("{}", summary(&files, &args));
    Ok(())
}

/// Measures every `.rs` file under `root`/`dir` but the test files, sorted by path.
fn measure_dir(root: &Path, dir: &Path) -> Result<Vec<Measured>> {
    let mut paths = Vec::new();
    rust_files(&root.join(dir), &mut paths)?;
    paths.sort();
    let mut measured = Vec::new();
    let mut test_files = Vec::new();
    for path in paths {
        let src = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let shape = measure(&src);
        let module_dir = child_module_dir(&path);
        test_files.extend(shape.test_modules.iter().map(|name| module_dir.join(name)));
        let shown = dir.join(path.strip_prefix(root.join(dir)).unwrap_or(&path));
        measured.push((path, Measured { shown, shape }));
    }
    Ok(measured
        .into_iter()
        .filter(|(path, _)| !is_test_file(path, &test_files))
        .map(|(_, m)| m)
        .collect())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let path = entry
            .with_context(|| format!("reading {}", dir.display()))?
            .path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// Where the out-of-line modules `file` declares live: beside a `mod.rs`, `lib.rs` or `main.rs`,
/// in a folder named after any other file.
fn child_module_dir(file: &Path) -> PathBuf {
    let parent = file.parent().unwrap_or(Path::new(""));
    match file.file_stem().and_then(|s| s.to_str()) {
        Some("mod" | "lib" | "main") | None => parent.to_path_buf(),
        Some(stem) => parent.join(stem),
    }
}

/// `tests.rs`, or the file or folder of a `#[cfg(test)] mod NAME;` (given without extension).
fn is_test_file(path: &Path, test_modules: &[PathBuf]) -> bool {
    path.file_name().is_some_and(|n| n == "tests.rs")
        || test_modules
            .iter()
            .any(|m| path == m.with_extension("rs") || path.starts_with(m))
}

/// Each offender as printed: a long file first, then its long functions in line order.
fn offenders(files: &[Measured], args: &Args) -> Vec<String> {
    let mut out = Vec::new();
    for Measured { shown, shape } in files {
        let path = shown.display();
        if shape.code_lines > args.max_file_lines {
            out.push(format!(
                "{path}: {} lines of code (limit {})",
                shape.code_lines, args.max_file_lines
            ));
        }
        let mut long: Vec<&FnSpan> = shape
            .fns
            .iter()
            .filter(|f| f.lines > args.max_fn_lines)
            .collect();
        long.sort_by_key(|f| f.line);
        for f in long {
            out.push(format!(
                "{path}:{}: fn {} is {} lines (limit {})",
                f.line, f.name, f.lines, args.max_fn_lines
            ));
        }
    }
    out
}

/// One line: files checked, the longest file and the longest function.
fn summary(files: &[Measured], args: &Args) -> String {
    let longest_file = files
        .iter()
        .max_by_key(|m| m.shape.code_lines)
        .map_or("none".into(), |m| {
            format!(
                "{} ({} lines of code)",
                m.shown.display(),
                m.shape.code_lines
            )
        });
    let longest_fn = files
        .iter()
        .flat_map(|m| m.shape.fns.iter().map(move |f| (m, f)))
        .max_by_key(|(_, f)| f.lines)
        .map_or("none".into(), |(m, f)| {
            format!(
                "{}:{} fn {} ({} lines)",
                m.shown.display(),
                f.line,
                f.name,
                f.lines
            )
        });
    format!(
        "shape: {} files checked in {}, all within {} lines of code per file and {} per function; \
         longest file {longest_file}; longest function {longest_fn}",
        files.len(),
        args.dirs.join(", "),
        args.max_file_lines,
        args.max_fn_lines
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn defaults_cover_every_shipped_crate_and_flags_override_them() {
        let defaults = parse_args(&[]).unwrap();
        assert_eq!(defaults.dirs, PRODUCT_SRC_DIRS);
        for krate in [
            "ttdp-controller",
            "ttdp-agent",
            "kubectl-tt-driver",
            "ttdp-drain",
        ] {
            assert!(
                defaults.dirs.contains(&format!("crates/{krate}/src")),
                "{krate}"
            );
        }
        assert_eq!((defaults.max_file_lines, defaults.max_fn_lines), (600, 80));
        let args = parse_args(&strings(&[
            "--dir",
            "xtask/src",
            "--dir",
            "crates/ttdp-kmod/src",
            "--max-file-lines",
            "500",
            "--max-fn-lines",
            "60",
        ]))
        .unwrap();
        assert_eq!(args.dirs, vec!["xtask/src", "crates/ttdp-kmod/src"]);
        assert_eq!((args.max_file_lines, args.max_fn_lines), (500, 60));
        assert!(parse_args(&strings(&["--max-fn-lines", "many"])).is_err());
        assert!(parse_args(&strings(&["--dir"])).is_err());
        assert!(parse_args(&strings(&["--frobnicate"])).is_err());
    }

    /// The crates that do not ship, and so are not checked: the test kit and the demo programs.
    const UNSHIPPED_CRATES: [&str; 2] = ["ttdp-testkit", "ttdp-programs"];

    #[test]
    fn every_crate_is_checked_or_named_as_unshipped() {
        let crates = repo_root().unwrap().join("crates");
        for entry in std::fs::read_dir(crates).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            let src = format!("crates/{name}/src");
            assert!(
                PRODUCT_SRC_DIRS.contains(&src.as_str())
                    || UNSHIPPED_CRATES.contains(&name.as_str()),
                "crate {name} is neither checked nor named unshipped"
            );
        }
    }

    #[test]
    fn a_long_fn_and_a_long_file_are_reported() {
        let body = "    step();\n".repeat(81);
        let src = format!("fn short() {{}}\n\nfn long() {{\n{body}}}\n");
        let files = [Measured {
            shown: PathBuf::from("src/a.rs"),
            shape: measure(&src),
        }];
        let args = Args {
            dirs: vec!["src".into()],
            max_file_lines: 80,
            max_fn_lines: 80,
        };
        assert_eq!(
            offenders(&files, &args),
            vec![
                "src/a.rs: 85 lines of code (limit 80)".to_string(),
                "src/a.rs:3: fn long is 83 lines (limit 80)".to_string()
            ]
        );
        let relaxed = Args {
            max_file_lines: 600,
            max_fn_lines: 83,
            ..args
        };
        assert!(offenders(&files, &relaxed).is_empty());
        assert!(
            summary(&files, &relaxed).contains("longest function src/a.rs:3 fn long (83 lines)")
        );
    }

    #[test]
    fn test_files_are_skipped() {
        let modules = [PathBuf::from("src/runtime/reconcile/more_tests")];
        assert!(is_test_file(Path::new("src/pure/tests.rs"), &[]));
        assert!(is_test_file(
            Path::new("src/runtime/reconcile/more_tests.rs"),
            &modules
        ));
        assert!(is_test_file(
            Path::new("src/runtime/reconcile/more_tests/mod.rs"),
            &modules
        ));
        assert!(!is_test_file(
            Path::new("src/runtime/reconcile.rs"),
            &modules
        ));
        assert_eq!(
            child_module_dir(Path::new("src/runtime/reconcile.rs")),
            Path::new("src/runtime/reconcile")
        );
        assert_eq!(
            child_module_dir(Path::new("src/runtime/mod.rs")),
            Path::new("src/runtime")
        );
    }
}
