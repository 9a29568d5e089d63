//! Whole-file reads in as few system calls as the file allows.
//!
//! std's whole-file reads ask for the file's size before reading: `fs::read_to_string` with an
//! fstat, `Read::read_to_end` on an open file with an fstat and an lseek. The kernel's own files
//! (procfs, sysfs) report a size of 0, so there the question buys nothing; and a file whose
//! metadata the caller has just read needs no second look. Every container start reads a dozen
//! such files, and each system call counts on a VM.

use std::io::Read;
use std::path::Path;

/// `bytes`, a file's whole contents, parsed as JSON. The text is checked as UTF-8 once, as a
/// whole: serde_json checks each string it meets when it parses bytes, and the files a start
/// reads (NVML's kept answer, the kept driver files, a handed-over inventory or plan) are mostly
/// paths and names, so that costs a start more than the check of the whole.
pub fn json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    serde_json::from_str(std::str::from_utf8(bytes).ok()?).ok()
}

/// What a kernel file of a few lines takes; a longer one is read all the same.
const KERNEL_FILE: usize = 4096;

/// The most allocated before reading, whatever size the file's metadata gave: a larger file is
/// read all the same, its buffer growing as it goes.
const UP_FRONT: usize = 16 << 20;

/// The rest of `file`, which its metadata says holds `size` bytes: read in one call, plus the
/// one that finds the end. A file that has grown or shrunk since is read to its end all the same.
pub fn read_sized(file: &mut std::fs::File, size: u64) -> std::io::Result<Vec<u8>> {
    read_to_end(file, usize::try_from(size).unwrap_or(0))
}

/// The text of the kernel file at `path` (procfs, sysfs), which reports no size.
pub fn read_kernel_text(path: &Path) -> std::io::Result<String> {
    let bytes = read_to_end(&mut std::fs::File::open(path)?, KERNEL_FILE)?;
    String::from_utf8(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Reads to the end into a buffer of `expected` bytes (at most [`UP_FRONT`]) and one more, so
/// that a file of that size ends at the second read; the buffer doubles whenever a read fills it.
fn read_to_end(file: &mut std::fs::File, expected: usize) -> std::io::Result<Vec<u8>> {
    let mut bytes = vec![0; expected.min(UP_FRONT) + 1];
    let mut filled = 0;
    loop {
        match file.read(&mut bytes[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if filled == bytes.len() {
            bytes.resize(filled * 2, 0);
        }
    }
    bytes.truncate(filled);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_whole_whatever_size_was_expected() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        let content: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        for expected in [0, 1, 4095, 10_000, 10_001, 50_000] {
            let mut file = std::fs::File::open(&path).unwrap();
            assert_eq!(
                read_sized(&mut file, expected).unwrap(),
                content,
                "{expected}"
            );
        }
        // From where an open file stands, as read_to_end reads.
        let mut file = std::fs::File::open(&path).unwrap();
        let mut head = [0; 100];
        file.read_exact(&mut head).unwrap();
        assert_eq!(read_sized(&mut file, 9_900).unwrap(), &content[100..]);
    }

    #[test]
    fn kernel_files_are_read_as_text() {
        let boot_id = read_kernel_text(Path::new("/proc/sys/kernel/random/boot_id")).unwrap();
        assert_eq!(boot_id.trim().len(), 36, "{boot_id:?}");
        assert!(read_kernel_text(Path::new("/proc/no-such-file")).is_err());
        let tmp = tempfile::tempdir().unwrap();
        // Longer than the first buffer.
        let long = tmp.path().join("long");
        let text = "line of text\n".repeat(1000);
        std::fs::write(&long, &text).unwrap();
        assert_eq!(read_kernel_text(&long).unwrap(), text);
        let path = tmp.path().join("bytes");
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        let e = read_kernel_text(&path).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    }
}
