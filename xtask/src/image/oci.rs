//! Reading an OCI image archive (an OCI image layout in a tar file, as `buildah push
//! oci-archive:`, `podman save --format oci-archive` and `docker save` since Docker 25 write
//! it): the manifest digest (checked against the blob's own sha256), the sizes, and unpacking
//! the layers into a root filesystem.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::rootfs::tar_member;
use crate::tools;

const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

/// One layer of the image.
#[derive(Debug, Clone)]
pub struct Layer {
    /// `sha256:<hex>`.
    pub digest: String,
    /// Its media type (says how it is compressed).
    pub media_type: String,
    /// Its size in the archive (compressed).
    pub size: u64,
}

/// What an OCI archive holds, read from its index and manifest.
#[derive(Debug, Clone)]
pub struct ImageArchive {
    /// The archive file.
    pub path: PathBuf,
    /// The manifest's digest: what `repository@<digest>` pulls once the archive is pushed as
    /// it is (e.g. `skopeo copy oci-archive:...`).
    pub digest: String,
    /// The layers, bottom first.
    pub layers: Vec<Layer>,
    /// The config blob's digest (environment, entrypoint, user).
    pub config_digest: String,
    /// Manifest, config and layers as stored (what a registry stores).
    pub compressed_size: u64,
}

impl ImageArchive {
    /// Reads `path`'s index and its one image manifest, and checks the manifest's digest.
    pub fn open(path: &Path) -> Result<Self> {
        let index: Value = serde_json::from_slice(&tar_member(path, "index.json")?)
            .with_context(|| format!("parsing index.json of {}", path.display()))?;
        let mut descriptor = first_manifest(&index, path)?;
        let mut manifest_bytes = blob(path, &descriptor)?;
        let mut manifest: Value = serde_json::from_slice(&manifest_bytes)?;
        // docker save may put a nested index first.
        if manifest["mediaType"] == INDEX_MEDIA_TYPE {
            descriptor = first_manifest(&manifest, path)?;
            manifest_bytes = blob(path, &descriptor)?;
            manifest = serde_json::from_slice(&manifest_bytes)?;
        }
        let digest = sha256_digest(&manifest_bytes);
        if digest != descriptor {
            bail!(
                "{}: manifest {descriptor} hashes to {digest}: the archive is corrupt",
                path.display()
            );
        }
        let layers: Vec<Layer> = manifest["layers"]
            .as_array()
            .context("the manifest has no layers")?
            .iter()
            .map(|l| {
                Ok(Layer {
                    digest: l["digest"]
                        .as_str()
                        .context("a layer has no digest")?
                        .into(),
                    media_type: l["mediaType"].as_str().unwrap_or_default().into(),
                    size: l["size"].as_u64().context("a layer has no size")?,
                })
            })
            .collect::<Result<_>>()?;
        let config_size = manifest["config"]["size"].as_u64().unwrap_or_default();
        let config_digest = manifest["config"]["digest"]
            .as_str()
            .context("the manifest names no config")?
            .to_owned();
        let compressed_size =
            manifest_bytes.len() as u64 + config_size + layers.iter().map(|l| l.size).sum::<u64>();
        Ok(Self {
            path: path.to_path_buf(),
            digest,
            layers,
            config_digest,
            compressed_size,
        })
    }

    /// The image config's `Env` (what a container runtime sets before the entrypoint).
    pub fn config_env(&self) -> Result<Vec<(String, String)>> {
        let config: Value = serde_json::from_slice(&blob(&self.path, &self.config_digest)?)
            .context("parsing the image config")?;
        let env = config["config"]["Env"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(env
            .iter()
            .filter_map(|e| e.as_str()?.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect())
    }

    /// The unpacked size: every layer decompressed (what a node's disk holds).
    pub fn uncompressed_size(&self) -> Result<u64> {
        let mut total = 0;
        for layer in &self.layers {
            let mut child = self.layer_stream(layer)?;
            let mut stdout = child.stdout.take().context("no stdout")?;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = stdout.read(&mut buf).context("reading a layer")?;
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            let status = child.wait()?;
            if !status.success() {
                bail!("decompressing layer {} failed ({status})", layer.digest);
            }
        }
        Ok(total)
    }

    /// Extracts the layers in order into `dest` (which must not exist), as a container runtime
    /// would; an image with whiteouts (deleted files) is refused, ours have none.
    pub fn unpack(&self, dest: &Path) -> Result<()> {
        std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
        for layer in &self.layers {
            let mut child = self.layer_stream(layer)?;
            let stdout = child.stdout.take().context("no stdout")?;
            let status = Command::new("tar")
                .args(["-x", "--numeric-owner", "-p", "-C"])
                .arg(dest)
                .stdin(stdout)
                .status()
                .context("running tar")?;
            if !status.success() || !child.wait()?.success() {
                bail!("unpacking layer {} failed", layer.digest);
            }
        }
        let listing = Command::new("find")
            .arg(dest)
            .args(["-name", ".wh.*"])
            .output()
            .context("running find")?;
        if !listing.stdout.is_empty() {
            bail!("the image has whiteout files; unpacking them is not supported");
        }
        Ok(())
    }

    /// `tar -xOf archive blob | <decompressor>` for one layer, its stdout piped.
    fn layer_stream(&self, layer: &Layer) -> Result<std::process::Child> {
        let name = blob_path(&layer.digest)?;
        let mut tar = Command::new("tar")
            .arg("-xOf")
            .arg(&self.path)
            .arg(&name)
            .stdout(Stdio::piped())
            .spawn()
            .context("running tar")?;
        let raw = tar.stdout.take().context("no stdout")?;
        let decompress = match layer.media_type.rsplit('+').next() {
            Some("gzip") => "gzip",
            Some("zstd") => "zstd",
            _ => "cat",
        };
        let mut cmd = Command::new(decompress);
        if decompress != "cat" {
            cmd.arg("-dc");
        }
        cmd.stdin(raw)
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("running {decompress}"))
    }
}

/// The digest of the first manifest an index lists.
fn first_manifest(index: &Value, path: &Path) -> Result<String> {
    index["manifests"][0]["digest"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("{} lists no image manifest", path.display()))
}

/// `blobs/sha256/<hex>` for `sha256:<hex>`.
fn blob_path(digest: &str) -> Result<String> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .with_context(|| format!("{digest:?} is not a sha256 digest"))?;
    Ok(format!("blobs/sha256/{hex}"))
}

fn blob(archive: &Path, digest: &str) -> Result<Vec<u8>> {
    tar_member(archive, &blob_path(digest)?)
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", tools::sha256_hex(bytes))
}

/// `sha256:<hex>` of a file's contents, read in a stream.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).with_context(|| format!("reading {}", path.display()))?;
    Ok(format!("sha256:{:x}", hasher.finalize()))
}

/// Whether `s` is `sha256:` and 64 lowercase hex digits.
pub fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_checked_for_shape() {
        let d = sha256_digest(b"");
        assert_eq!(
            d,
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert!(is_digest(&d));
        assert!(!is_digest("sha256:E3B0"));
        assert!(blob_path("sha256:../../etc/passwd").is_err());
        assert_eq!(blob_path(&d).unwrap(), format!("blobs/sha256/{}", &d[7..]));
    }
}
