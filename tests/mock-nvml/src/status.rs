//! `nvmlReturn_t`: the status every NVML entry point returns.

use std::ffi::{CStr, c_uint};

/// An `nvmlReturn_t` value. `repr(transparent)` makes it ABI-identical to the C enum,
/// so exports can return it directly; it is a newtype rather than a Rust enum because
/// the topology may inject any code, including ones this mock never produces itself.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status(pub c_uint);

impl Status {
    pub const SUCCESS: Self = Self(0);
    pub const UNINITIALIZED: Self = Self(1);
    pub const INVALID_ARGUMENT: Self = Self(2);
    pub const NOT_SUPPORTED: Self = Self(3);
    pub const NO_PERMISSION: Self = Self(4);
    pub const NOT_FOUND: Self = Self(6);
    pub const INSUFFICIENT_SIZE: Self = Self(7);
    pub const DRIVER_NOT_LOADED: Self = Self(9);
    #[cfg_attr(not(feature = "memory-limits"), allow(dead_code))]
    pub const OPERATING_SYSTEM: Self = Self(17);
    pub const IN_USE: Self = Self(19);
    pub const INSUFFICIENT_RESOURCES: Self = Self(23);
    pub const ARGUMENT_VERSION_MISMATCH: Self = Self(25);
    pub const UNKNOWN: Self = Self(999);

    /// The text `nvmlErrorString` gives, worded as the real library words it.
    pub fn description(self) -> &'static CStr {
        match self.0 {
            0 => c"Success",
            1 => c"Uninitialized",
            2 => c"Invalid Argument",
            3 => c"Not Supported",
            4 => c"Insufficient Permissions",
            5 => c"Already Initialized",
            6 => c"Not Found",
            7 => c"Insufficient Size",
            8 => c"Insufficient External Power",
            9 => c"Driver Not Loaded",
            10 => c"Timeout",
            12 => c"NVML Shared Library Not Found",
            13 => c"Function Not Found",
            15 => c"GPU is lost",
            17 => c"The operating system has blocked the request.",
            18 => c"RM has detected an NVML/RM version mismatch.",
            19 => c"In use by another client",
            20 => c"Insufficient Memory",
            23 => c"Insufficient resources",
            25 => c"Argument version mismatch",
            _ => c"Unknown Error",
        }
    }
}

/// What the internal functions return: `Err` carries the status to hand back to C.
pub type NvmlResult<T = ()> = Result<T, Status>;
