//! x86_64: the entry point, the system-call instruction and numbers, `struct stat` and the
//! image's own addresses.

use core::arch::{asm, naked_asm};

/// The only relocation a static PIE of this program carries.
pub const R_RELATIVE: usize = 8; // R_X86_64_RELATIVE

/// System-call numbers (arch/x86/entry/syscalls/syscall_64.tbl).
pub mod nr {
    pub const WRITE: usize = 1;
    pub const CLOSE: usize = 3;
    pub const FSTAT: usize = 5;
    pub const MMAP: usize = 9;
    pub const RT_SIGACTION: usize = 13;
    pub const EXECVE: usize = 59;
    pub const SOCKET: usize = 41;
    pub const CONNECT: usize = 42;
    pub const RECVFROM: usize = 45;
    pub const SENDMSG: usize = 46;
    pub const SETSOCKOPT: usize = 54;
    pub const FCNTL: usize = 72;
    pub const OPENAT: usize = 257;
    pub const NEWFSTATAT: usize = 262;
    pub const READLINKAT: usize = 267;
}

/// `struct stat` on x86_64; only the mode and size are read.
#[repr(C)]
pub struct Stat {
    _dev: u64,
    _ino: u64,
    _nlink: u64,
    pub mode: u32,
    _uid: u32,
    _gid: u32,
    _pad: u32,
    _rdev: u64,
    pub size: i64,
    _rest: [u64; 12],
}

/// The kernel enters here with argc, argv and envp on the stack.
#[unsafe(naked)]
#[unsafe(no_mangle)]
unsafe extern "C" fn _start() -> ! {
    naked_asm!(
        "xor ebp, ebp",
        "mov rdi, rsp",
        "and rsp, -16",
        "call {start}",
        "ud2",
        start = sym crate::start::start,
    )
}

/// # Safety
/// The arguments are valid for system call `n`.
pub unsafe fn syscall6(n: usize, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the caller passes arguments valid for system call `n`; the kernel clobbers
    // only rcx and r11.
    unsafe {
        asm!("syscall", inlateout("rax") n as isize => ret,
            in("rdi") a[0], in("rsi") a[1], in("rdx") a[2], in("r10") a[3], in("r8") a[4], in("r9") a[5],
            lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret
}

pub fn exit(code: i32) -> ! {
    // SAFETY: exit_group takes a plain integer and does not return.
    unsafe {
        asm!("syscall", in("rax") 231, in("rdi") code as isize, options(noreturn, nostack));
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
            "lea {b}, [rip + __ehdr_start]",
            "lea {d}, [rip + _DYNAMIC]",
            b = out(reg) base,
            d = out(reg) dynamic,
            options(nostack, pure, nomem)
        );
    }
    (base, dynamic)
}
