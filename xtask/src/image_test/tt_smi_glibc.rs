//! The tt-smi the agent copies to nodes runs against the node's glibc: it is run in a Debian 11
//! root (glibc 2.31, older than any supported host's: Ubuntu 22.04 has 2.35) made by
//! mmdebstrap for the check, its processes under mmdebstrap's hooks (`chroot` with `/proc`,
//! `/sys` and `/dev` mounted). That it runs in Debian 12's root is the agent image's own check.

use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::image::pins::{Pins, RootPins};
use crate::image::rootfs;

/// What the root prints when the checks inside it passed.
const PASSED: &str = "TT_SMI_RAN_IN_ROOT";

/// Runs `tt_smi --version` and `--help` inside a minimal root of `suite`, with that root's glibc;
/// fails unless both succeed, the version is `version` and the root's glibc is `glibc`.
pub fn runs_in(pins: &Pins, suite: &str, glibc: &str, tt_smi: &Path, version: &str) -> Result<()> {
    let root = RootPins {
        gcc: None,
        suite: suite.to_owned(),
        packages: Vec::new(),
    };
    let script = format!(
        "ldd --version | head -n 1; /usr/local/bin/tt-smi --version && \
         /usr/local/bin/tt-smi --help >/dev/null && echo {PASSED}"
    );
    let mut cmd = rootfs::mmdebstrap(pins, &root, "null", Path::new("/dev/null"))?;
    cmd.arg(format!(
            "--customize-hook=copy-in {} /usr/local/bin",
            tt_smi.display()
        ))
        .arg(format!(
            "--customize-hook=chroot \"$1\" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root TERM=dumb sh -c '{script}' >&2"
        ));
    let out = cmd.output().context("running mmdebstrap")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let glibc_line = format!("{glibc}\n");
    if !out.status.success() || !text.contains(PASSED) || !text.contains(version) {
        bail!("tt-smi did not run in a {suite} root: {}", text.trim());
    }
    if !text.contains(&glibc_line) {
        bail!("the {suite} root's glibc is not {glibc}: {}", text.trim());
    }
    Ok(())
}
