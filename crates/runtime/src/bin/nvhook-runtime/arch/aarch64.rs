//! aarch64: the entry point, the system-call instruction and numbers, `struct stat` and the
//! image's own addresses.
//!
//! aarch64 has only the generic system calls (include/uapi/asm-generic/unistd.h): no open,
//! stat or readlink, which is why the shared code uses openat, newfstatat and readlinkat on
//! every architecture.

use core::arch::{asm, naked_asm};

/// The only relocation a static PIE of this program carries.
pub const R_RELATIVE: usize = 1027; // R_AARCH64_RELATIVE

/// System-call numbers (include/uapi/asm-generic/unistd.h).
pub mod nr {
    pub const FCNTL: usize = 25;
    pub const OPENAT: usize = 56;
    pub const CLOSE: usize = 57;
    pub const WRITE: usize = 64;
    pub const READLINKAT: usize = 78;
    pub const NEWFSTATAT: usize = 79;
    pub const FSTAT: usize = 80;
    pub const RT_SIGACTION: usize = 134;
    pub const SOCKET: usize = 198;
    pub const CONNECT: usize = 203;
    pub const RECVFROM: usize = 207;
    pub const SETSOCKOPT: usize = 208;
    pub const SENDMSG: usize = 211;
    pub const EXECVE: usize = 221;
    pub const MMAP: usize = 222;
}

const EXIT_GROUP: usize = 94;

/// `struct stat` of the generic ABI (include/uapi/asm-generic/stat.h), 128 bytes; only the
/// mode and size are read.
#[repr(C)]
pub struct Stat {
    _dev: u64,
    _ino: u64,
    pub mode: u32,
    _nlink: u32,
    _uid: u32,
    _gid: u32,
    _rdev: u64,
    _pad1: u64,
    pub size: i64,
    _rest: [u64; 9],
}

const _: () = assert!(core::mem::size_of::<Stat>() == 128);

/// The kernel enters here with sp pointing at argc, then argv and envp; x0 is not a
/// pointer to them (it may hold a finalizer for a dynamic loader to pass on, which a static
/// program without one ignores).
#[unsafe(naked)]
#[unsafe(no_mangle)]
unsafe extern "C" fn _start() -> ! {
    naked_asm!(
        "mov x29, #0",
        "mov x30, #0",
        "mov x0, sp",
        "and sp, x0, #-16",
        "bl {start}",
        "brk #0",
        start = sym crate::start::start,
    )
}

/// # Safety
/// The arguments are valid for system call `n`.
pub unsafe fn syscall6(n: usize, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the caller passes arguments valid for system call `n`; the kernel preserves
    // every register but x0.
    unsafe {
        asm!("svc #0", in("x8") n, inlateout("x0") a[0] as isize => ret,
            in("x1") a[1], in("x2") a[2], in("x3") a[3], in("x4") a[4], in("x5") a[5],
            options(nostack));
    }
    ret
}

pub fn exit(code: i32) -> ! {
    // SAFETY: exit_group takes a plain integer and does not return.
    unsafe {
        asm!("svc #0", in("x8") EXIT_GROUP, in("x0") code as isize, options(noreturn, nostack));
    }
}

/// The image's load address (its ELF header) and its `_DYNAMIC` array, PC-relative, so
/// right before any relocation is applied.
#[inline(always)]
pub fn image_base_and_dynamic() -> (usize, usize) {
    let base: usize;
    let dynamic: usize;
    // SAFETY: the linker defines both symbols for every ELF image.
    unsafe {
        asm!(
            "adrp {b}, __ehdr_start",
            "add {b}, {b}, :lo12:__ehdr_start",
            "adrp {d}, _DYNAMIC",
            "add {d}, {d}, :lo12:_DYNAMIC",
            b = out(reg) base,
            d = out(reg) dynamic,
            options(nostack, pure, nomem)
        );
    }
    (base, dynamic)
}
