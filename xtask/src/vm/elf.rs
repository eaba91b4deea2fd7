//! Reads just enough of an ELF file to tell a static executable from a dynamic one: the guest has
//! no libc, so everything copied into it (busybox, the scenario's executables) must be static.

/// True for an ELF file without a program interpreter (`PT_INTERP`): it runs without a libc.
pub fn is_static_elf(bytes: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        bytes
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
    };
    let u32_at = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        bytes
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .and_then(|v| usize::try_from(v).ok())
    };
    // 64-bit little-endian ELF only (what x86_64 produces).
    if bytes.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    (0..phnum).all(|i| u32_at(phoff + i * phentsize).is_some_and(|kind| kind != PT_INTERP))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64-bit little-endian ELF header followed by program headers of the given types.
    fn elf_with_program_headers(types: &[u32]) -> Vec<u8> {
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&(types.len() as u16).to_le_bytes());
        for kind in types {
            let mut header = vec![0u8; 56];
            header[..4].copy_from_slice(&kind.to_le_bytes());
            elf.extend(header);
        }
        elf
    }

    #[test]
    fn an_executable_with_an_interpreter_is_not_static() {
        assert!(is_static_elf(&elf_with_program_headers(&[6, 1, 1])));
        assert!(!is_static_elf(&elf_with_program_headers(&[6, 3, 1])));
    }

    #[test]
    fn non_elf_and_truncated_files_are_not_static() {
        assert!(!is_static_elf(b"#!/bin/sh\n"));
        let mut truncated = elf_with_program_headers(&[1, 1]);
        truncated.truncate(64 + 56);
        assert!(!is_static_elf(&truncated));
    }
}
