//! Whether anything opened a file for I/O: an image's device node or FIFO that the hook must
//! never open (O_PATH opens do not count).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub struct OpenWatch {
    fd: OwnedFd,
}

impl OpenWatch {
    /// Watches `path` itself (its inode: a later rename over the name does not matter).
    pub fn new(path: &Path) -> OpenWatch {
        // SAFETY: inotify_init1 has no preconditions; the result is owned below.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(
            raw >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: raw is a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let c = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
        // SAFETY: c is NUL-terminated; fd is an inotify descriptor. IN_DONT_FOLLOW: the
        // entry itself, whatever it is.
        let wd = unsafe {
            libc::inotify_add_watch(
                fd.as_raw_fd(),
                c.as_ptr(),
                libc::IN_OPEN | libc::IN_DONT_FOLLOW,
            )
        };
        assert!(
            wd >= 0,
            "inotify_add_watch {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        OpenWatch { fd }
    }

    /// Whether an open event arrived since the watch began.
    pub fn opened(&self) -> bool {
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: buf is writable for its length.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return false;
            }
            // struct inotify_event: wd, mask, cookie, len, then `len` bytes of name.
            let mut events = &buf[..n as usize];
            while events.len() >= 16 {
                let field = |i: usize| u32::from_ne_bytes(events[i..i + 4].try_into().unwrap());
                if field(4) & libc::IN_OPEN != 0 {
                    return true;
                }
                events = &events[(16 + field(12) as usize).min(events.len())..];
            }
        }
    }
}
