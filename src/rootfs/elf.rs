//! The little of a little-endian ELF file's layout nvhook reads in an image (a library's
//! SONAME, a note): its header, and fixed-width fields at offsets, through a `read_at`
//! that fills a buffer from an offset or returns false. Nothing is loaded or run.

/// An ELF file's header, read and checked (little-endian, 32- or 64-bit).
pub struct Elf {
    pub head: [u8; 64],
    /// ELF64; ELF32 otherwise.
    pub wide: bool,
}

impl Elf {
    pub fn read(read_at: &dyn Fn(u64, &mut [u8]) -> bool) -> Option<Elf> {
        let mut head = [0u8; 64];
        if !read_at(0, &mut head) || head[..4] != *b"\x7fELF" || head[5] != 1 {
            return None;
        }
        let wide = match head[4] {
            1 => false,
            2 => true,
            _ => return None,
        };
        Some(Elf { head, wide })
    }

    /// A word of the file's class at `o` of `b`: 8 bytes in ELF64, 4 in ELF32.
    pub fn word(&self, b: &[u8], o: usize) -> Option<u64> {
        if self.wide {
            u64_at(b, o)
        } else {
            u32_at(b, o).map(u64::from)
        }
    }
}

pub fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}

pub fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}

pub fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}
