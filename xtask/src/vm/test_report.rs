//! Prints what each scenario's VM produced and decides the outcome: a scenario passes only when
//! its script exited 0 and it reported at least one passed test and no failed one.

use std::time::Duration;

use anyhow::{Result, bail};

use super::boot::Boot;

/// Test counts reported by a scenario's output.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Tests that passed.
    pub passed: u64,
    /// Tests that failed.
    pub failed: u64,
}

/// One scenario's boot and what it reported.
#[derive(Debug)]
pub struct ScenarioReport {
    name: &'static str,
    boot: Boot,
    counts: Counts,
}

impl ScenarioReport {
    /// Reads the counts out of the boot's output.
    pub fn new(name: &'static str, boot: Boot) -> Self {
        let counts = count_tests(&boot.output);
        Self { name, boot, counts }
    }

    /// Why this scenario failed, or `None` if it passed.
    fn failure(&self) -> Option<String> {
        let boot = &self.boot;
        if boot.timed_out {
            return Some(format!(
                "timed out after {:.0} s",
                boot.elapsed.as_secs_f64()
            ));
        }
        if let Some(error) = &boot.qemu_error {
            return Some(error.clone());
        }
        match boot.exit_code {
            None => Some(
                "the VM reported no exit status (crash or panic? see the console above)".into(),
            ),
            Some(0) if self.counts.failed > 0 => {
                Some(format!("{} tests failed", self.counts.failed))
            }
            Some(0) if self.counts.passed == 0 => Some("no test ran".into()),
            Some(0) => None,
            Some(code) => Some(format!("exited with status {code}")),
        }
    }
}

/// Sums libtest's `test result: ... N passed; M failed; ...` lines and plain
/// `[word:] N passed, M failed` lines.
pub fn count_tests(output: &str) -> Counts {
    let mut counts = Counts::default();
    for line in output.lines() {
        let line = line.trim();
        let body = if let Some(rest) = line.strip_prefix("test result: ") {
            rest.split_once(". ").map_or(rest, |(_, counts)| counts)
        } else if is_plain_summary(line) {
            line.split_once(": ").map_or(line, |(_, counts)| counts)
        } else {
            continue;
        };
        let words: Vec<&str> = body
            .split([' ', ';', ','])
            .filter(|w| !w.is_empty())
            .collect();
        for pair in words.windows(2) {
            let Ok(n) = pair[0].parse::<u64>() else {
                continue;
            };
            match pair[1] {
                "passed" => counts.passed += n,
                "failed" => counts.failed += n,
                _ => {}
            }
        }
    }
    counts
}

/// `N passed, N failed` alone on a line, optionally after one word and a colon.
fn is_plain_summary(line: &str) -> bool {
    let body = match line.split_once(": ") {
        Some((word, rest)) if !word.contains(' ') => rest,
        _ => line,
    };
    let words: Vec<&str> = body.split([' ', ',']).filter(|w| !w.is_empty()).collect();
    matches!(words.as_slice(), [p, "passed", f, "failed", ..] if p.parse::<u64>().is_ok() && f.parse::<u64>().is_ok())
}

impl ScenarioReport {
    /// Prints the scenario's output (and the kernel console when it failed).
    pub fn print(&self) {
        println!("\n===== vm-test scenario {}: output =====", self.name);
        print!("{}", self.boot.output);
        if self.failure().is_some() {
            println!(
                "\n----- vm-test scenario {}: kernel console -----",
                self.name
            );
            print!("{}", self.boot.console);
        }
        println!(
            "===== vm-test scenario {}: {} passed, {} failed, boot cycle {:.1} s, serial logs in {} =====\n",
            self.name,
            self.counts.passed,
            self.counts.failed,
            self.boot.elapsed.as_secs_f64(),
            self.boot.run_dir.display()
        );
    }
}

/// Prints the summary; fails if any scenario failed.
pub fn judge(reports: &[ScenarioReport], total: Duration) -> Result<()> {
    let mut failed = Vec::new();
    let mut sum = Counts::default();
    for report in reports {
        sum.passed += report.counts.passed;
        sum.failed += report.counts.failed;
        let outcome = report.failure();
        println!(
            "vm-test: scenario {:<12} {:>3} passed, {:>3} failed, {:6.1} s  {}",
            report.name,
            report.counts.passed,
            report.counts.failed,
            report.boot.elapsed.as_secs_f64(),
            outcome.as_deref().unwrap_or("ok")
        );
        if let Some(why) = outcome {
            failed.push(format!("{}: {why}", report.name));
        }
    }
    println!("vm-test: total {:.1} s", total.as_secs_f64());
    println!("vm-test: {} passed, {} failed", sum.passed, sum.failed);
    if !failed.is_empty() {
        bail!("vm-test failed:\n  {}", failed.join("\n  "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_summaries_are_summed() {
        let output = "running 3 tests\ntest a ... ok\n\
                      test result: ok. 3 passed; 0 failed; 2 ignored; 0 measured; 1 filtered out; finished in 0.10s\n\
                      test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s\n";
        assert_eq!(
            count_tests(output),
            Counts {
                passed: 4,
                failed: 2
            }
        );
    }

    #[test]
    fn plain_summaries_count_but_other_lines_do_not() {
        let output = "agent: 5 passed, 1 failed\n7 passed, 0 failed\nwe passed 3 checkpoints\nlog: 9 passed\n";
        assert_eq!(
            count_tests(output),
            Counts {
                passed: 12,
                failed: 1
            }
        );
    }

    #[test]
    fn a_run_with_zero_tests_counts_zero() {
        let output = "running 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n";
        assert_eq!(count_tests(output), Counts::default());
    }
}
