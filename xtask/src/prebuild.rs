//! `cargo xtask prebuild --kernel-headers DIR --version V`: builds tt-kmd's `tenstorrent.ko` for
//! the kernel whose build tree is DIR, with ttdp-kmod's own build (the one the agent runs), into
//! `OUT/<version>/<kernelRelease>/tenstorrent.ko` plus `tenstorrent.ko.sha256`. OUT can be served
//! as it is by any web server; a policy then names it in `spec.source.prebuilt.url` as
//! `https://host/<where OUT is served>/{version}/{kernelRelease}/tenstorrent.ko`
//! (docs/air-gapped.md).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use ttdp_kmod::{BuildOptions, DEFAULT_REPOSITORY, HostRoot, KO_FILE_NAME, KmdVersion};

use crate::{crd, tools};

const USAGE: &str = "usage: cargo xtask prebuild --kernel-headers DIR --version V [--out DIR]
                           [--repository URL] [--commit SHA] [--kernel-release R] [--make-arg ARG]...

  --kernel-headers DIR  a kernel build tree: /usr/src/linux-headers-<release> or
                        /lib/modules/<release>/build of a machine with that kernel's headers
  --version V           the tt-kmd release (tag ttkmd-V)
  --out DIR             where the served tree goes (default: <target>/prebuilt)
  --repository URL      where tag ttkmd-V is fetched from (default: tt-kmd on GitHub)
  --commit SHA          refuse to build unless the tag points at this commit
  --kernel-release R    the release, when DIR has no include/generated/utsrelease.h
  --make-arg ARG        extra make argument, e.g. CC=x86_64-linux-gnu-gcc-12 (repeatable)";

/// One module to prebuild.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prebuild {
    /// The kernel build tree.
    pub kernel_headers: PathBuf,
    /// The kernel release; `None`: read from the build tree.
    pub kernel_release: Option<String>,
    /// The tt-kmd version.
    pub version: KmdVersion,
    /// Where the tag is fetched from.
    pub repository: String,
    /// The commit the tag must point at.
    pub commit: Option<String>,
    /// The served tree.
    pub out: PathBuf,
    /// Extra `make` arguments.
    pub make_args: Vec<String>,
}

/// What [`build`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prebuilt {
    /// `OUT/<version>/<release>/tenstorrent.ko`.
    pub ko: PathBuf,
    /// Its hex sha256, also in `tenstorrent.ko.sha256` beside it.
    pub sha256: String,
    /// The kernel release it was built for.
    pub release: String,
    /// The commit the tag pointed at.
    pub commit: String,
}

pub fn run(args: &[String]) -> Result<()> {
    let prebuild = parse(args)?;
    let done = build(&prebuild)?;
    println!(
        "prebuild: tt-kmd {} for kernel {} (commit {}) -> {}\n  sha256 {}\n  serve {} and set spec.source.prebuilt.url to <its URL>/{{version}}/{{kernelRelease}}/{KO_FILE_NAME}",
        prebuild.version,
        done.release,
        done.commit,
        done.ko.display(),
        done.sha256,
        prebuild.out.display()
    );
    Ok(())
}

fn parse(args: &[String]) -> Result<Prebuild> {
    let mut headers = None;
    let mut version = None;
    let mut release = None;
    let mut repository = DEFAULT_REPOSITORY.to_owned();
    let mut commit = None;
    let mut out = crd::workspace_root().join("target/prebuilt");
    let mut make_args = Vec::new();
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        if matches!(flag.as_str(), "-h" | "--help") {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let Some(value) = rest.next() else {
            bail!("{flag} needs a value\n\n{USAGE}");
        };
        match flag.as_str() {
            "--kernel-headers" => headers = Some(PathBuf::from(value)),
            "--version" => {
                version = Some(
                    value
                        .parse::<KmdVersion>()
                        .map_err(|e| anyhow::anyhow!("--version: {e}"))?,
                );
            }
            "--kernel-release" => release = Some(value.clone()),
            "--repository" => repository = value.clone(),
            "--commit" => commit = Some(value.clone()),
            "--out" => out = PathBuf::from(value),
            "--make-arg" => make_args.push(value.clone()),
            other => bail!("unknown flag {other}\n\n{USAGE}"),
        }
    }
    let (Some(kernel_headers), Some(version)) = (headers, version) else {
        bail!("--kernel-headers and --version are required\n\n{USAGE}");
    };
    Ok(Prebuild {
        kernel_headers,
        kernel_release: release,
        version,
        repository,
        commit,
        out,
        make_args,
    })
}

/// Builds the module and writes it and its checksum where a server expects them.
pub fn build(prebuild: &Prebuild) -> Result<Prebuilt> {
    let headers = &prebuild.kernel_headers;
    let release = match &prebuild.kernel_release {
        Some(release) => release.clone(),
        None => release_of(headers)?,
    };
    let options = BuildOptions {
        repository: prebuild.repository.clone(),
        commit: prebuild.commit.clone(),
        make_args: prebuild.make_args.clone(),
        build_dir: Some(headers.clone()),
        ..BuildOptions::default()
    };
    // the host root only matters without a build tree, and there always is one here
    let built = ttdp_kmod::build_module(&HostRoot::new("/"), &release, &prebuild.version, &options)
        .with_context(|| format!("building tt-kmd {} for kernel {release}", prebuild.version))?;
    let bytes = std::fs::read(&built.ko_path)
        .with_context(|| format!("reading {}", built.ko_path.display()))?;
    let sha256 = tools::sha256_hex(&bytes);
    let dir = prebuild.out.join(prebuild.version.as_str()).join(&release);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let ko = dir.join(KO_FILE_NAME);
    std::fs::write(&ko, &bytes).with_context(|| format!("writing {}", ko.display()))?;
    let sum = dir.join(format!("{KO_FILE_NAME}.sha256"));
    // sha256sum's format, so `sha256sum -c` checks a copy
    std::fs::write(&sum, format!("{sha256}  {KO_FILE_NAME}\n"))
        .with_context(|| format!("writing {}", sum.display()))?;
    Ok(Prebuilt {
        ko,
        sha256,
        release,
        commit: built.source_commit,
    })
}

/// The release a configured kernel build tree was made for: `UTS_RELEASE` of
/// `include/generated/utsrelease.h`, what a module's vermagic carries. (Debian's headers
/// packages put the upstream version, not the release, in `include/config/kernel.release`.)
fn release_of(headers: &Path) -> Result<String> {
    let file = headers.join("include/generated/utsrelease.h");
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "reading {}: point --kernel-headers at a configured kernel build tree such as /usr/src/linux-headers-<release>, or pass --kernel-release",
            file.display()
        )
    })?;
    text.lines()
        .find_map(|line| line.trim().strip_prefix("#define UTS_RELEASE"))
        .map(|value| value.trim().trim_matches('"').to_owned())
        .filter(|release| !release.is_empty() && !release.contains(char::is_whitespace))
        .with_context(|| format!("{} defines no UTS_RELEASE", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_are_read_and_the_defaults_filled_in() {
        let p = parse(&args(&[
            "--kernel-headers",
            "/usr/src/linux-headers-6.1.0-57-amd64",
            "--version",
            "2.8.0",
            "--make-arg",
            "CC=gcc-12",
        ]))
        .unwrap();
        assert_eq!(p.version.as_str(), "2.8.0");
        assert_eq!(p.repository, DEFAULT_REPOSITORY);
        assert!(p.out.ends_with("target/prebuilt"));
        assert_eq!(p.make_args, ["CC=gcc-12"]);
        let err = parse(&args(&["--version", "2.8"])).unwrap_err();
        assert!(err.to_string().contains("--version"), "{err}");
        let err = parse(&args(&["--version", "2.8.0"])).unwrap_err();
        assert!(err.to_string().contains("--kernel-headers"), "{err}");
    }

    #[test]
    fn a_tree_without_its_release_file_is_explained() {
        let dir = tempfile_dir();
        let err = release_of(&dir).unwrap_err();
        assert!(format!("{err:#}").contains("--kernel-release"), "{err:#}");
        std::fs::create_dir_all(dir.join("include/generated")).unwrap();
        let header = dir.join("include/generated/utsrelease.h");
        std::fs::write(&header, "#define UTS_RELEASE \"6.1.0-57-amd64\"\n").unwrap();
        assert_eq!(release_of(&dir).unwrap(), "6.1.0-57-amd64");
        std::fs::write(&header, "/* empty */\n").unwrap();
        assert!(release_of(&dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-prebuild-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
