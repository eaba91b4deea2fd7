//! [`ModInfo`]: the `.modinfo` section of a `.ko` file (version, vermagic, srcversion, name).
//!
//! A kernel module is an ELF relocatable object; `.modinfo` holds NUL-separated `key=value`
//! strings. This reads ELF64 section headers by hand (both byte orders), nothing else.

use std::path::Path;

use crate::KmdVersion;
use crate::KmodError;
use crate::module_signature::SIGNATURE_MARKER;

/// The fields of a module's `.modinfo` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ModInfo {
    /// Every `key=value` pair in file order (keys such as `alias` repeat).
    pub fields: Vec<(String, String)>,
}

impl ModInfo {
    /// Reads and parses the `.modinfo` section of the `.ko` at `path`.
    pub fn from_file(path: &Path) -> Result<Self, KmodError> {
        let bytes = std::fs::read(path).map_err(|e| KmodError::io("read", path, e))?;
        Self::parse(&bytes).map_err(|reason| KmodError::Modinfo {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Parses an ELF64 module image. The error says what is wrong with it.
    pub fn parse(elf: &[u8]) -> Result<Self, String> {
        let section = modinfo_section(elf)?;
        let fields = section
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .filter_map(|s| {
                let text = String::from_utf8_lossy(s);
                let (key, value) = text.split_once('=')?;
                Some((key.to_string(), value.to_string()))
            })
            .collect();
        Ok(Self { fields })
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `version=` (what `/sys/module/<name>/version` shows once loaded).
    pub fn version(&self) -> Option<&str> {
        self.get("version")
    }

    /// `vermagic=`, e.g. `6.8.0-111-generic SMP preempt mod_unload modversions`.
    pub fn vermagic(&self) -> Option<&str> {
        self.get("vermagic")
    }

    /// The kernel release the module was built for: the first word of its vermagic.
    pub fn vermagic_release(&self) -> Option<&str> {
        self.vermagic().and_then(|v| v.split_whitespace().next())
    }

    /// `srcversion=`: a checksum of the module's sources.
    pub fn srcversion(&self) -> Option<&str> {
        self.get("srcversion")
    }

    /// `name=`: the module name.
    pub fn name(&self) -> Option<&str> {
        self.get("name")
    }

    /// Whether the module declares `version` and was built for kernel `release` (its vermagic).
    pub fn is_for(&self, version: &KmdVersion, release: &str) -> bool {
        self.version() == Some(version.as_str()) && self.vermagic_release() == Some(release)
    }

    /// [`ModInfo::is_for`], or [`KmodError::BuiltWrongModule`] saying what it declares instead.
    pub(crate) fn check_built_for(
        &self,
        version: &KmdVersion,
        release: &str,
    ) -> Result<(), KmodError> {
        if self.is_for(version, release) {
            return Ok(());
        }
        Err(KmodError::BuiltWrongModule {
            version: version.to_string(),
            release: release.to_string(),
            found_version: self.version().map(str::to_string),
            found_vermagic: self.vermagic().map(str::to_string),
        })
    }
}

/// Whether the module file at `path` carries an appended signature.
pub fn is_signed(path: &Path) -> Result<bool, KmodError> {
    let bytes = std::fs::read(path).map_err(|e| KmodError::io("read", path, e))?;
    Ok(bytes.ends_with(SIGNATURE_MARKER))
}

/// Little- or big-endian reads at an offset, failing instead of panicking when out of bounds.
struct Reader<'a> {
    bytes: &'a [u8],
    big_endian: bool,
}

impl Reader<'_> {
    fn take<const N: usize>(&self, at: usize) -> Result<[u8; N], String> {
        let end = at.checked_add(N).ok_or("offset overflow")?;
        let slice = self
            .bytes
            .get(at..end)
            .ok_or_else(|| format!("truncated ELF file (needs byte {end})"))?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        if self.big_endian {
            out.reverse();
        }
        Ok(out)
    }
    fn u16(&self, at: usize) -> Result<usize, String> {
        Ok(usize::from(u16::from_le_bytes(self.take(at)?)))
    }
    fn u32(&self, at: usize) -> Result<usize, String> {
        usize::try_from(u32::from_le_bytes(self.take(at)?)).map_err(|e| e.to_string())
    }
    fn u64(&self, at: usize) -> Result<usize, String> {
        usize::try_from(u64::from_le_bytes(self.take(at)?)).map_err(|e| e.to_string())
    }
}

/// The bytes of the `.modinfo` section.
fn modinfo_section(elf: &[u8]) -> Result<&[u8], String> {
    if elf.get(0..4) != Some(b"\x7fELF") {
        return Err("not an ELF file".to_string());
    }
    if elf.get(4) != Some(&2) {
        return Err("not a 64-bit ELF file".to_string());
    }
    let big_endian = match elf.get(5) {
        Some(1) => false,
        Some(2) => true,
        _ => return Err("unknown ELF byte order".to_string()),
    };
    let r = Reader {
        bytes: elf,
        big_endian,
    };
    let shoff = r.u64(0x28)?;
    let shentsize = r.u16(0x3a)?;
    let shnum = r.u16(0x3c)?;
    let shstrndx = r.u16(0x3e)?;
    if shentsize < 64 || shnum == 0 || shstrndx >= shnum {
        return Err("no usable ELF section header table".to_string());
    }
    let header = |i: usize| -> Result<(usize, usize, usize), String> {
        let at = shoff
            .checked_add(i.checked_mul(shentsize).ok_or("offset overflow")?)
            .ok_or("offset overflow")?;
        Ok((r.u32(at)?, r.u64(at + 24)?, r.u64(at + 32)?))
    };
    let slice = |offset: usize, size: usize| -> Result<&[u8], String> {
        let end = offset.checked_add(size).ok_or("offset overflow")?;
        elf.get(offset..end)
            .ok_or_else(|| "ELF section outside the file".to_string())
    };
    let (_, names_offset, names_size) = header(shstrndx)?;
    let names = slice(names_offset, names_size)?;
    for i in 0..shnum {
        let (name_at, offset, size) = header(i)?;
        let name = names.get(name_at..).unwrap_or_default();
        let name = name.split(|b| *b == 0).next().unwrap_or_default();
        if name == b".modinfo" {
            return slice(offset, size);
        }
    }
    Err("no .modinfo section".to_string())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a minimal ELF64 object with a `.shstrtab` and the given `.modinfo` bytes.
    pub(crate) fn elf_with_modinfo(modinfo: &[u8], big_endian: bool) -> Vec<u8> {
        let put16 = |v: u16| {
            if big_endian {
                v.to_be_bytes().to_vec()
            } else {
                v.to_le_bytes().to_vec()
            }
        };
        let put32 = |v: u32| {
            if big_endian {
                v.to_be_bytes().to_vec()
            } else {
                v.to_le_bytes().to_vec()
            }
        };
        let put64 = |v: u64| {
            if big_endian {
                v.to_be_bytes().to_vec()
            } else {
                v.to_le_bytes().to_vec()
            }
        };
        let shstrtab = b"\0.shstrtab\0.modinfo\0".to_vec();
        let mut out = vec![0x7f, b'E', b'L', b'F', 2, if big_endian { 2 } else { 1 }, 1];
        out.resize(64, 0);
        let modinfo_at = out.len();
        out.extend_from_slice(modinfo);
        let strtab_at = out.len();
        out.extend_from_slice(&shstrtab);
        let shoff = out.len();
        out[0x28..0x30].copy_from_slice(&put64(shoff as u64));
        out[0x3a..0x3c].copy_from_slice(&put16(64));
        out[0x3c..0x3e].copy_from_slice(&put16(3));
        out[0x3e..0x40].copy_from_slice(&put16(1));
        let mut section = |name: u32, offset: usize, size: usize| {
            let mut h = put32(name);
            h.extend(put32(1));
            h.extend(put64(0));
            h.extend(put64(0));
            h.extend(put64(offset as u64));
            h.extend(put64(size as u64));
            h.resize(64, 0);
            out.extend(h);
        };
        section(0, 0, 0);
        section(1, strtab_at, shstrtab.len());
        section(11, modinfo_at, modinfo.len());
        out
    }

    #[test]
    fn fields_are_read_in_both_byte_orders() {
        let modinfo = b"version=2.8.0\0\0vermagic=6.8.0-111-generic SMP preempt mod_unload \0srcversion=ABC\0name=tenstorrent\0alias=pci:v00001E52d*\0";
        for big_endian in [false, true] {
            let info = ModInfo::parse(&elf_with_modinfo(modinfo, big_endian)).unwrap();
            assert_eq!(info.version(), Some("2.8.0"));
            assert_eq!(info.vermagic_release(), Some("6.8.0-111-generic"));
            assert_eq!(info.srcversion(), Some("ABC"));
            assert_eq!(info.name(), Some("tenstorrent"));
            assert_eq!(info.get("alias"), Some("pci:v00001E52d*"));
            assert_eq!(info.get("license"), None);
        }
    }

    #[test]
    fn broken_files_are_rejected_with_a_reason() {
        assert_eq!(ModInfo::parse(b"hello").unwrap_err(), "not an ELF file");
        assert_eq!(
            ModInfo::parse(b"\x7fELF\x01\x01").unwrap_err(),
            "not a 64-bit ELF file"
        );
        let good = elf_with_modinfo(b"version=1.0.0\0", false);
        let truncated = &good[..good.len() - 40];
        assert!(ModInfo::parse(truncated).unwrap_err().contains("truncated"));
        let mut renamed = good.clone();
        let at = renamed.windows(8).position(|w| w == b".modinfo").unwrap();
        renamed[at + 1] = b'x';
        assert_eq!(ModInfo::parse(&renamed).unwrap_err(), "no .modinfo section");
    }

    #[test]
    fn signed_modules_end_with_the_signature_marker() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.ko");
        let mut bytes = elf_with_modinfo(b"version=1.0.0\0", false);
        std::fs::write(&path, &bytes).unwrap();
        assert!(!is_signed(&path).unwrap());
        bytes.extend_from_slice(b"SIGNATURE BYTES");
        bytes.extend_from_slice(SIGNATURE_MARKER);
        std::fs::write(&path, &bytes).unwrap();
        assert!(is_signed(&path).unwrap());
        assert_eq!(ModInfo::from_file(&path).unwrap().version(), Some("1.0.0"));
    }

    #[test]
    fn from_file_names_the_file_in_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenstorrent.ko");
        std::fs::write(&path, b"garbage").unwrap();
        let err = ModInfo::from_file(&path).unwrap_err().to_string();
        assert!(
            err.contains("tenstorrent.ko") && err.contains("not an ELF file"),
            "{err}"
        );
        let err = ModInfo::from_file(&dir.path().join("missing.ko")).unwrap_err();
        assert_eq!(err.reason(), "IoError");
    }
}
