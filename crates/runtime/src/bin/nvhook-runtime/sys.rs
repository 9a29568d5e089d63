//! The few Linux system calls nvhook-runtime makes, with no libc; the numbers, `struct stat`
//! and the instruction are the arch module's. Only calls aarch64 has too: openat, newfstatat,
//! readlinkat (no open, stat, readlink).

use crate::arch::{self, nr, syscall6};

pub use arch::{Stat, exit};

// The same values on x86_64 and aarch64 (asm-generic).
const AT_FDCWD: isize = -100;
const O_RDONLY_CLOEXEC: usize = 0o2_000_000;
const O_RDWR: usize = 2;
const PROT_READ: usize = 1;
const PROT_WRITE: usize = 2;
const MAP_ANONYMOUS: usize = 0x20;
const EINVAL: isize = 22;
const MAP_PRIVATE: usize = 2;
const F_GETFD: usize = 1;
const SIGPIPE: usize = 13;
pub const EBADF: isize = 9;

pub const S_IFMT: u32 = 0o170000;
pub const S_IFREG: u32 = 0o100000;

pub fn write_all(fd: usize, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe a live slice.
        let n = unsafe {
            syscall6(
                nr::WRITE,
                [fd, bytes.as_ptr() as usize, bytes.len(), 0, 0, 0],
            )
        };
        if n <= 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

/// `execve`; returns the negated errno when it fails.
///
/// # Safety
/// `path` is NUL-terminated; `argv` and `envp` are NULL-terminated arrays of C strings.
pub unsafe fn execve(path: &[u8], argv: *const *const u8, envp: *const *const u8) -> isize {
    // SAFETY: as the caller promises.
    unsafe {
        syscall6(
            nr::EXECVE,
            [
                path.as_ptr() as usize,
                argv as usize,
                envp as usize,
                0,
                0,
                0,
            ],
        )
    }
}

/// `stat` (following links) of a NUL-terminated path.
pub fn stat(path: &[u8]) -> Option<Stat> {
    let mut st = core::mem::MaybeUninit::<Stat>::uninit();
    // SAFETY: `path` is NUL-terminated (checked by the callers' join) and `st` is large
    // enough for the kernel's struct stat.
    let r = unsafe {
        syscall6(
            nr::NEWFSTATAT,
            [
                AT_FDCWD as usize,
                path.as_ptr() as usize,
                st.as_mut_ptr() as usize,
                0,
                0,
                0,
            ],
        )
    };
    // SAFETY: a successful newfstatat filled it.
    (r == 0).then(|| unsafe { st.assume_init() })
}

/// The whole regular file, mapped read-only (an empty file is an empty slice), or the
/// negated errno. Never unmapped: the process execs.
pub fn map_file(path: &[u8]) -> Result<&'static [u8], isize> {
    // SAFETY: `path` is NUL-terminated.
    let fd = unsafe {
        syscall6(
            nr::OPENAT,
            [
                AT_FDCWD as usize,
                path.as_ptr() as usize,
                O_RDONLY_CLOEXEC,
                0,
                0,
                0,
            ],
        )
    };
    if fd < 0 {
        return Err(-fd);
    }
    let fd = fd as usize;
    let mut st = core::mem::MaybeUninit::<Stat>::uninit();
    // SAFETY: `st` is large enough for the kernel's struct stat.
    let r = unsafe { syscall6(nr::FSTAT, [fd, st.as_mut_ptr() as usize, 0, 0, 0, 0]) };
    let out = if r < 0 {
        Err(-r)
    } else {
        // SAFETY: fstat succeeded.
        let st = unsafe { st.assume_init() };
        if st.mode & S_IFMT != S_IFREG {
            Err(EINVAL)
        } else if st.size == 0 {
            Ok(&[][..])
        } else {
            // SAFETY: a fresh private read-only mapping of an open regular file.
            let addr = unsafe {
                syscall6(
                    nr::MMAP,
                    [0, st.size as usize, PROT_READ, MAP_PRIVATE, fd, 0],
                )
            };
            mapped(addr).map(|p| {
                // SAFETY: the kernel mapped `size` readable bytes there, never unmapped.
                unsafe { core::slice::from_raw_parts(p as *const u8, st.size as usize) }
            })
        }
    };
    close(fd);
    out
}

/// A zeroed array of `n` pointers, for an argv of any length.
pub fn map_pointers(n: usize) -> Option<&'static mut [*const u8]> {
    let len = n * core::mem::size_of::<usize>();
    // SAFETY: a fresh private anonymous mapping.
    let addr = unsafe {
        syscall6(
            nr::MMAP,
            [
                0,
                len,
                PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS,
                usize::MAX,
                0,
            ],
        )
    };
    // SAFETY: the kernel mapped `len` zeroed, writable bytes there, never unmapped.
    mapped(addr)
        .ok()
        .map(|p| unsafe { core::slice::from_raw_parts_mut(p as *mut *const u8, n) })
}

/// mmap's result: an address, or a negated errno in -4095..0.
fn mapped(addr: isize) -> Result<usize, isize> {
    if (-4095..0).contains(&addr) {
        Err(-addr)
    } else {
        Ok(addr as usize)
    }
}

/// The target of `/proc/self/exe` into `buf`.
pub fn own_exe(buf: &mut [u8]) -> Option<&[u8]> {
    // SAFETY: the path is NUL-terminated and `buf` is writable for its length.
    let n = unsafe {
        syscall6(
            nr::READLINKAT,
            [
                AT_FDCWD as usize,
                c"/proc/self/exe".as_ptr() as usize,
                buf.as_mut_ptr() as usize,
                buf.len(),
                0,
                0,
            ],
        )
    };
    (n > 0 && (n as usize) < buf.len()).then(|| &buf[..n as usize])
}

/// Whether descriptor `fd` is closed.
pub fn is_closed(fd: usize) -> bool {
    // SAFETY: F_GETFD only reads the descriptor's flags.
    unsafe { syscall6(nr::FCNTL, [fd, F_GETFD, 0, 0, 0, 0]) == -EBADF }
}

/// Opens /dev/null read-write; the lowest free descriptor is returned.
pub fn open_dev_null() -> isize {
    // SAFETY: the path is NUL-terminated.
    unsafe {
        syscall6(
            nr::OPENAT,
            [
                AT_FDCWD as usize,
                c"/dev/null".as_ptr() as usize,
                O_RDWR,
                0,
                0,
                0,
            ],
        )
    }
}

/// SIGPIPE back to its default for the runtime we exec (an ignored signal stays ignored
/// across exec).
pub fn default_sigpipe() {
    // struct kernel_sigaction: handler SIG_DFL, flags, restorer, mask.
    let action = [0usize; 4];
    // SAFETY: a valid kernel_sigaction with an 8-byte mask.
    unsafe {
        syscall6(
            nr::RT_SIGACTION,
            [SIGPIPE, action.as_ptr() as usize, 0, 8, 0, 0],
        )
    };
}

/// A connected `SOCK_SEQPACKET` Unix socket to the NUL-terminated `path`, or the negated
/// errno. Close-on-exec: the runtime this process becomes never sees it.
pub fn connect_unix(path: &[u8]) -> Result<usize, isize> {
    const AF_UNIX: usize = 1;
    const SOCK_SEQPACKET: usize = 5;
    // SOCK_CLOEXEC is O_CLOEXEC.
    const SOCK_CLOEXEC: usize = O_RDONLY_CLOEXEC;
    // struct sockaddr_un: the family, then up to 108 bytes of path with its NUL.
    let mut addr = [0u8; 110];
    let name = addr.get_mut(2..2 + path.len()).ok_or(EINVAL)?;
    name.copy_from_slice(path);
    addr[0] = AF_UNIX as u8;
    // SAFETY: plain arguments.
    let fd = unsafe {
        syscall6(
            nr::SOCKET,
            [AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, 0, 0, 0],
        )
    };
    if fd < 0 {
        return Err(-fd);
    }
    let fd = fd as usize;
    // SAFETY: `addr` holds a sockaddr_un of the given length.
    let r = unsafe {
        syscall6(
            nr::CONNECT,
            [fd, addr.as_ptr() as usize, 2 + path.len(), 0, 0, 0],
        )
    };
    if r < 0 {
        close(fd);
        return Err(-r);
    }
    Ok(fd)
}

/// The working directory as an `O_PATH` descriptor, or the negated errno.
pub fn open_cwd() -> isize {
    const O_PATH: usize = 0o10_000_000;
    // SAFETY: the path is NUL-terminated.
    unsafe {
        syscall6(
            nr::OPENAT,
            [
                AT_FDCWD as usize,
                c".".as_ptr() as usize,
                O_PATH | O_RDONLY_CLOEXEC,
                0,
                0,
                0,
            ],
        )
    }
}

/// Sends `msg` as one message with descriptor `fd` attached (`SCM_RIGHTS`); the bytes sent,
/// or the negated errno.
pub fn send_with_fd(sock: usize, msg: &[u8], fd: usize) -> isize {
    const SOL_SOCKET: usize = 1;
    const SCM_RIGHTS: usize = 1;
    const MSG_NOSIGNAL: usize = 0x4000;
    let iov = [msg.as_ptr() as usize, msg.len()];
    // struct cmsghdr (len, level, type) and one int, padded to CMSG_SPACE(4); both
    // architectures are little-endian, so level and type share the second word that way.
    let control = [16 + 4, SOL_SOCKET | SCM_RIGHTS << 32, fd];
    // struct msghdr: name, namelen, iov, iovlen, control, controllen, flags.
    let header = [
        0,
        0,
        iov.as_ptr() as usize,
        1,
        control.as_ptr() as usize,
        core::mem::size_of_val(&control),
        0,
    ];
    // SAFETY: the header and everything it points to live across the call.
    unsafe {
        syscall6(
            nr::SENDMSG,
            [sock, header.as_ptr() as usize, MSG_NOSIGNAL, 0, 0, 0],
        )
    }
}

/// Receives one message into `buf`, waiting at most `seconds`; its length (0: the peer
/// closed), or the negated errno (EAGAIN when the time ran out).
pub fn recv_within(sock: usize, buf: &mut [u8], seconds: usize) -> isize {
    const SOL_SOCKET: usize = 1;
    const SO_RCVTIMEO: usize = 20;
    // struct timeval.
    let timeout = [seconds, 0usize];
    // SAFETY: `timeout` is a struct timeval of the given size.
    let r = unsafe {
        syscall6(
            nr::SETSOCKOPT,
            [
                sock,
                SOL_SOCKET,
                SO_RCVTIMEO,
                timeout.as_ptr() as usize,
                core::mem::size_of_val(&timeout),
                0,
            ],
        )
    };
    if r < 0 {
        return r;
    }
    // SAFETY: `buf` is writable for its length; no source address is asked for.
    unsafe {
        syscall6(
            nr::RECVFROM,
            [sock, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
        )
    }
}

pub fn close(fd: usize) {
    // SAFETY: closing a descriptor of our own.
    unsafe { syscall6(nr::CLOSE, [fd, 0, 0, 0, 0, 0]) };
}
