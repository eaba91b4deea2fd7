//! [`SimKmdRepo`]: a local git repository of simulated tt-kmd sources with one `ttkmd-<version>`
//! tag per version, so the real fetch (`git clone --branch ttkmd-<v>`) and build code paths run
//! unchanged in tests and the demo, without network.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Simulated tt-kmd source: `version=` in `.modinfo`, as `MODULE_VERSION()` would put it.
const SIM_MODULE_C: &str = "/* Simulated tt-kmd source for ttdp tests (version @VERSION@). */
#define SIM_MODINFO(n, s) static const char n[] __attribute__((section(\".modinfo\"), used, aligned(1))) = s
SIM_MODINFO(sim_version, \"version=@VERSION@\");
SIM_MODINFO(sim_license, \"license=GPL\");
SIM_MODINFO(sim_description, \"description=Simulated Tenstorrent AI accelerator driver\");
int tenstorrent_sim_init(void) { return 0; }
";

/// A kbuild-style Makefile like the real one: its fallback calls `uname -r`, which ttdp never uses.
const SIM_SOURCE_MAKEFILE: &str = "obj-m := tenstorrent.o
tenstorrent-y := module.o
all:
\t$(MAKE) -C /lib/modules/$(shell uname -r)/build M=$(CURDIR) modules
";

/// A git repository of simulated tt-kmd sources.
#[derive(Debug, Clone)]
pub struct SimKmdRepo {
    dir: PathBuf,
}

impl SimKmdRepo {
    /// Creates a repository in `dir` (created if needed) with a tag `ttkmd-<v>` for each version.
    pub fn create(dir: impl Into<PathBuf>, versions: &[&str]) -> io::Result<Self> {
        let repo = Self { dir: dir.into() };
        std::fs::create_dir_all(&repo.dir)?;
        repo.git(&["init", "-q", "-b", "main"])?;
        std::fs::write(repo.dir.join("Makefile"), SIM_SOURCE_MAKEFILE)?;
        for version in versions {
            repo.add_version(version)?;
        }
        Ok(repo)
    }

    /// A repository another process created in `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<Self> {
        let repo = Self { dir: dir.into() };
        if repo.dir.join(".git").is_dir() {
            Ok(repo)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is not a git repository", repo.dir.display()),
            ))
        }
    }

    /// Commits sources declaring `version` and tags them `ttkmd-<version>`.
    pub fn add_version(&self, version: &str) -> io::Result<()> {
        self.commit_tag(version, &SIM_MODULE_C.replace("@VERSION@", version))
    }

    /// Tags `version`, its tree shipping `rule` as tt-kmd's `udev-50-tenstorrent.rules`
    /// (`None`: no rule file); later tags keep the file as it is left.
    pub fn add_version_with_udev_rule(&self, version: &str, rule: Option<&str>) -> io::Result<()> {
        let path = self.dir.join(crate::udev_rule::UDEV_RULE_SOURCE);
        match rule {
            Some(text) => std::fs::write(&path, text)?,
            None => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            },
        }
        self.add_version(version)
    }

    /// Commits sources for `version` that do not compile, and tags them `ttkmd-<version>`.
    pub fn add_broken_version(&self, version: &str) -> io::Result<()> {
        let source = SIM_MODULE_C.replace("@VERSION@", version)
            + "int broken(void) { return missing_symbol_in_ttkmd_source; }\n";
        self.commit_tag(version, &source)
    }

    /// Commits sources whose `.modinfo` says version `declared` but tags them `ttkmd-<tag_version>`.
    pub fn add_mislabelled_version(&self, tag_version: &str, declared: &str) -> io::Result<()> {
        self.commit_tag(tag_version, &SIM_MODULE_C.replace("@VERSION@", declared))
    }

    /// The commit tag `ttkmd-<version>` points at.
    pub fn tag_commit(&self, version: &str) -> io::Result<String> {
        let out = self.git_output(&["rev-parse", &format!("ttkmd-{version}^{{commit}}")])?;
        Ok(out.trim().to_string())
    }

    /// Moves tag `ttkmd-<version>` to a new commit (other sources, same version), as a force-push
    /// of a release tag would; returns the new commit.
    pub fn move_tag(&self, version: &str) -> io::Result<String> {
        let source = SIM_MODULE_C.replace("@VERSION@", version) + "/* re-tagged */\n";
        std::fs::write(self.dir.join("module.c"), source)?;
        self.git(&["add", "-A"])?;
        self.git(&[
            "commit",
            "-q",
            "-m",
            &format!("tt-kmd {version}, re-tagged"),
        ])?;
        self.git(&["tag", "-f", &format!("ttkmd-{version}")])?;
        self.tag_commit(version)
    }

    /// The repository directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The repository as a `file://` URL (what an installer's repository setting takes).
    pub fn url(&self) -> String {
        format!("file://{}", self.dir.display())
    }

    fn commit_tag(&self, version: &str, source: &str) -> io::Result<()> {
        std::fs::write(self.dir.join("module.c"), source)?;
        self.git(&["add", "-A"])?;
        self.git(&[
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            &format!("tt-kmd {version}"),
        ])?;
        self.git(&["tag", &format!("ttkmd-{version}")])
    }

    fn git(&self, args: &[&str]) -> io::Result<()> {
        self.git_output(args).map(drop)
    }

    fn git_output(&self, args: &[&str]) -> io::Result<String> {
        let output = Command::new("git")
            .arg("-C")
            .arg(&self.dir)
            .args([
                "-c",
                "user.name=ttdp sim",
                "-c",
                "user.email=sim@ttdp.invalid",
            ])
            .args(["-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"])
            .args(args)
            .output()?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(io::Error::other(format!(
                "git {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }
}
