//! One ELF note of a file in the container, read without loading or running it: a compat
//! libcuda's `.note.cuda.fwd_compatibility`, which says which host drivers it serves (what
//! NVIDIA's `enable-cuda-compat` hook reads, `readelf -p .note.cuda.fwd_compatibility`).
//! Only the ELF header, the section headers and the section-name table are read besides the
//! note itself, each bounded.

use super::elf::{Elf, u16_at, u32_at, u64_at};

/// Section headers looked at, and the largest section-name table and note read.
const MAX_SECTIONS: usize = 4096;
const MAX_NAMES: usize = 1 << 20;
const MAX_NOTE: usize = 1 << 16;

/// The description of the note owned by `owner` in the SHT_NOTE section `section` of a
/// little-endian ELF file, read through `read_at` (fills the buffer from the offset, or
/// returns false), NUL bytes trimmed from both ends; None when there is no such note.
pub fn note_description(
    read_at: &dyn Fn(u64, &mut [u8]) -> bool,
    section: &str,
    owner: &str,
) -> Option<Vec<u8>> {
    let elf = Elf::read(read_at)?;
    let (head, wide) = (elf.head, elf.wide);
    let word = |b: &[u8], o: usize| elf.word(b, o);
    let (shoff, shentsize, shnum, shstrndx) = if wide {
        (
            u64_at(&head, 0x28)?,
            u16_at(&head, 0x3a)?,
            u16_at(&head, 0x3c)?,
            u16_at(&head, 0x3e)?,
        )
    } else {
        (
            u64::from(u32_at(&head, 0x20)?),
            u16_at(&head, 0x2e)?,
            u16_at(&head, 0x30)?,
            u16_at(&head, 0x32)?,
        )
    };
    let (shentsize, shnum) = (usize::from(shentsize), usize::from(shnum));
    if shnum > MAX_SECTIONS || shentsize < if wide { 64 } else { 40 } {
        return None;
    }
    let mut headers = vec![0u8; shentsize * shnum];
    if !read_at(shoff, &mut headers) {
        return None;
    }
    // (name offset, type, file offset, size, alignment) of a section header.
    let header = |h: &[u8]| {
        Some(if wide {
            (
                u32_at(h, 0)?,
                u32_at(h, 4)?,
                word(h, 24)?,
                word(h, 32)?,
                word(h, 48)?,
            )
        } else {
            (
                u32_at(h, 0)?,
                u32_at(h, 4)?,
                word(h, 16)?,
                word(h, 20)?,
                word(h, 32)?,
            )
        })
    };
    let read = |offset: u64, size: u64, limit: usize| {
        let size = usize::try_from(size).ok().filter(|s| *s <= limit)?;
        let mut data = vec![0u8; size];
        read_at(offset, &mut data).then_some(data)
    };
    let names = headers.chunks(shentsize).nth(usize::from(shstrndx))?;
    let (_, _, names_offset, names_size, _) = header(names)?;
    let names = read(names_offset, names_size, MAX_NAMES)?;
    let (_, _, offset, size, align) = headers.chunks(shentsize).find_map(|h| {
        let h = header(h)?;
        let name = names.get(usize::try_from(h.0).ok()?..)?;
        let name = &name[..name.iter().position(|&b| b == 0)?];
        (h.1 == SHT_NOTE && name == section.as_bytes()).then_some(h)
    })?;
    let data = read(offset, size, MAX_NOTE)?;
    let (name_size, desc_size) = (u32_at(&data, 0)?, u32_at(&data, 4)?);
    if name_size == 0 || desc_size == 0 {
        return None;
    }
    // The name is padded to the section's alignment, as NVIDIA's reader takes it.
    let align = align.max(1);
    let padded = u64::from(name_size).checked_add(align - 1)? & !(align - 1);
    let name = data.get(12..)?;
    let name = &name[..name.len().min(usize::try_from(padded).ok()?)];
    if trim_nul(name) != owner.as_bytes() {
        return None;
    }
    let desc = data.get(12 + usize::try_from(padded).ok()?..)?;
    let desc = &desc[..desc.len().min(usize::try_from(desc_size).ok()?)];
    Some(trim_nul(desc).to_vec())
}

const SHT_NOTE: u32 = 7;

fn trim_nul(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|&b| b != 0).map_or(start, |e| e + 1);
    &bytes[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The note as NVIDIA's compat libraries carry it: namesz, descsz, type, then the owner
    /// and the description, each padded to 4.
    fn note(owner: &[u8], desc: &[u8]) -> Vec<u8> {
        let mut note = Vec::new();
        note.extend((owner.len() as u32).to_le_bytes());
        note.extend((desc.len() as u32).to_le_bytes());
        note.extend(1u32.to_le_bytes());
        note.extend(owner);
        note.resize(note.len().next_multiple_of(4), 0);
        note.extend(desc);
        note.resize(note.len().next_multiple_of(4), 0);
        note
    }

    /// A little-endian ELF64 file with a null section, the name table and one section
    /// `name` of `kind` holding `data` (4-aligned).
    fn elf64(name: &str, kind: u32, data: &[u8]) -> Vec<u8> {
        let names = format!("\0.shstrtab\0{name}\0");
        let (names_at, data_at) = (64u64, 64 + names.len() as u64);
        let shoff = (data_at + data.len() as u64).next_multiple_of(8);
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        elf.extend(names.as_bytes());
        elf.extend(data);
        elf.resize(shoff as usize, 0);
        let header = |name: u32, kind: u32, offset: u64, size: u64, align: u64| {
            let mut h = vec![0u8; 64];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&offset.to_le_bytes());
            h[32..40].copy_from_slice(&size.to_le_bytes());
            h[48..56].copy_from_slice(&align.to_le_bytes());
            h
        };
        elf.extend(vec![0u8; 64]);
        elf.extend(header(1, 3, names_at, names.len() as u64, 1));
        elf.extend(header(11, kind, data_at, data.len() as u64, 4));
        elf
    }

    fn read(bytes: &[u8]) -> impl Fn(u64, &mut [u8]) -> bool + '_ {
        move |offset, buf| {
            let start = offset as usize;
            bytes
                .get(start..start + buf.len())
                .map(|b| buf.copy_from_slice(b))
                .is_some()
        }
    }

    const SECTION: &str = ".note.cuda.fwd_compatibility";
    const OWNER: &str = "NVIDIA Corporation";

    #[test]
    fn the_note_is_read_back() {
        let json = br#"{"Format":1,"CUDA Version":"13.0","Driver":[535,550,570,575],"Device":[]}"#;
        let elf = elf64(SECTION, SHT_NOTE, &note(b"NVIDIA Corporation\0", json));
        assert_eq!(
            note_description(&read(&elf), SECTION, OWNER).as_deref(),
            Some(&json[..])
        );
        // Another owner, another section name, a section that is not a note: none.
        let other = elf64(SECTION, SHT_NOTE, &note(b"GNU\0", json));
        assert_eq!(note_description(&read(&other), SECTION, OWNER), None);
        let other = elf64(
            ".note.gnu.build-id",
            SHT_NOTE,
            &note(b"NVIDIA Corporation\0", json),
        );
        assert_eq!(note_description(&read(&other), SECTION, OWNER), None);
        let other = elf64(SECTION, 1, &note(b"NVIDIA Corporation\0", json));
        assert_eq!(note_description(&read(&other), SECTION, OWNER), None);
    }

    #[test]
    fn short_or_foreign_files_have_no_note() {
        for bytes in [&b""[..], b"\x7fELF", b"#!/bin/sh\necho hi\n"] {
            assert_eq!(note_description(&read(bytes), SECTION, OWNER), None);
        }
    }
}
