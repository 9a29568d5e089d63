//! The mock NVML (tests/mock-nvml) answers nvml-wrapper, the library this crate asks NVML
//! through, as the real libnvidia-ml does. Loads the built mock the way nvhook-nvml does, from
//! a driver directory laid out like simnode's: `libnvidia-ml.so.<version>`, the
//! `libnvidia-ml.so.1` symlink, and `nvml-topology.json` beside them.
//!
//! Cargo does not build a cdylib for `cargo test`, so the first test to need the
//! library runs `cargo build -p mock-nvml` (a no-op when it is up to date).

use std::ffi::{CString, c_char, c_int, c_uint};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::InitFlags;
use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use serde_json::{Value, json};
use tempfile::TempDir;

const A100_UUID: &str = "GPU-5e1a0c2e-1c6b-4bd5-9a4f-1f7c2d6e8a01";
const H100_UUID: &str = "GPU-7a3b9c1d-2e4f-4a6b-8c0d-3f5e7a9b1c02";
const MIG_UUIDS: [&str; 2] = [
    "MIG-0b5c7d9e-1f3a-5b7c-9d1e-3f5a7b9c1d03",
    "MIG-1c6d8e0f-2a4b-6c8d-0e2f-4a6b8c0d2e04",
];

/// The built mock library, built on first use.
fn mock_library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(build_mock)
}

fn build_mock() -> PathBuf {
    // The test binary lives in <target>/<profile>/deps; the cdylib in <target>/<profile>.
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target profile dir");
    let target_dir = profile_dir.parent().expect("target dir");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "--quiet", "-p", "mock-nvml", "--target-dir"])
        .arg(target_dir);
    if profile_dir.file_name() == Some("release".as_ref()) {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build -p mock-nvml");
    assert!(status.success(), "cargo build -p mock-nvml failed");
    profile_dir.join("libmock_nvml.so")
}

/// A simulated driver directory holding the mock and a topology.
struct DriverDir {
    dir: TempDir,
}

impl DriverDir {
    /// Installs the mock like simnode does; `topology` of `None` leaves the file out.
    fn new(topology: Option<&Value>) -> Self {
        let dir = TempDir::new().expect("temp dir");
        let versioned = dir.path().join("libnvidia-ml.so.550.54.15");
        std::fs::copy(mock_library(), &versioned).expect("copy mock library");
        std::os::unix::fs::symlink(
            "libnvidia-ml.so.550.54.15",
            dir.path().join("libnvidia-ml.so.1"),
        )
        .expect("soname symlink");
        if let Some(topology) = topology {
            std::fs::write(dir.path().join("nvml-topology.json"), topology.to_string())
                .expect("write topology");
        }
        Self { dir }
    }

    fn library(&self) -> PathBuf {
        self.dir.path().join("libnvidia-ml.so.1")
    }

    fn init(&self) -> Result<Nvml, NvmlError> {
        Nvml::builder().lib_path(self.library().as_os_str()).init()
    }
}

fn topology() -> Value {
    json!({
        "driver_version": "550.54.15",
        "cuda_driver_version": 12040,
        "nvml_version": "12.550.54.15",
        "gpus": [
            {
                "uuid": A100_UUID, "minor": 0, "pci_bus_id": "00000000:18:00.0",
                "pci_device_id": 0x20B210DE_u32, "name": "NVIDIA A100-SXM4-80GB",
                "brand": 2, "architecture": 7, "cuda_compute_capability": [8, 0],
                "memory_total": 85899345920_u64, "persistence_mode": true,
                "mig_mode": 1,
                "mig_devices": [
                    { "uuid": MIG_UUIDS[0], "gpu_instance_id": 1, "compute_instance_id": 0,
                      "name": "NVIDIA A100-SXM4-80GB MIG 1g.10gb" },
                    { "uuid": MIG_UUIDS[1], "gpu_instance_id": 2, "compute_instance_id": 0,
                      "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb" }
                ]
            },
            {
                "uuid": H100_UUID, "minor": 3, "pci_bus_id": "00000001:B3:00.0",
                "pci_device_id": 0x233010DE_u32, "name": "NVIDIA H100 80GB HBM3",
                "brand": 14, "architecture": 9, "cuda_compute_capability": [9, 0],
                "mig_mode": 0
            }
        ]
    })
}

fn with_field(field: &str, value: Value) -> Value {
    let mut topology = topology();
    topology[field] = value;
    topology
}

/// The mock needs no library the real libnvidia-ml.so.1 does not (libc, libm, libdl,
/// libpthread; the loader, present in any glibc image): a minimal image loads both alike.
#[test]
fn the_mock_needs_only_what_the_real_library_needs() {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(mock_library())
        .output()
        .expect("run readelf (binutils)");
    let text = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split_once('[')?.1.split_once(']').map(|(name, _)| name))
        .collect();
    assert!(needed.contains(&"libc.so.6"), "{text}");
    let real = [
        "libc.so.6",
        "libm.so.6",
        "libdl.so.2",
        "libpthread.so.0",
        "ld-linux-x86-64.so.2",
    ];
    for name in needed {
        assert!(
            real.contains(&name),
            "the mock needs {name}, the real library does not"
        );
    }
}

#[test]
fn reports_system_versions() {
    let nvml = DriverDir::new(Some(&topology())).init().unwrap();
    assert_eq!(nvml.sys_driver_version().unwrap(), "550.54.15");
    assert_eq!(nvml.sys_nvml_version().unwrap(), "12.550.54.15");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12040);
}

#[test]
fn reports_each_gpu() {
    let nvml = DriverDir::new(Some(&topology())).init().unwrap();
    assert_eq!(nvml.device_count().unwrap(), 2);

    let a100 = nvml.device_by_index(0).unwrap();
    assert_eq!(a100.uuid().unwrap(), A100_UUID);
    assert_eq!(a100.index().unwrap(), 0);
    assert_eq!(a100.minor_number().unwrap(), 0);
    assert_eq!(a100.name().unwrap(), "NVIDIA A100-SXM4-80GB");
    assert_eq!(a100.brand().unwrap(), Brand::Tesla);
    assert_eq!(a100.architecture().unwrap(), DeviceArchitecture::Ampere);
    let cc = a100.cuda_compute_capability().unwrap();
    assert_eq!((cc.major, cc.minor), (8, 0));
    assert_eq!(a100.memory_info().unwrap().total, 80 << 30);
    assert!(a100.is_in_persistent_mode().unwrap());
    let pci = a100.pci_info().unwrap();
    assert_eq!(pci.bus_id, "00000000:18:00.0");
    assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x18, 0));
    assert_eq!(pci.pci_device_id, 0x20B210DE);

    let h100 = nvml.device_by_index(1).unwrap();
    assert_eq!(h100.uuid().unwrap(), H100_UUID);
    assert_eq!(h100.index().unwrap(), 1);
    assert_eq!(h100.minor_number().unwrap(), 3);
    assert_eq!(h100.name().unwrap(), "NVIDIA H100 80GB HBM3");
    assert_eq!(h100.brand().unwrap(), Brand::Nvidia);
    assert_eq!(h100.architecture().unwrap(), DeviceArchitecture::Hopper);
    let cc = h100.cuda_compute_capability().unwrap();
    assert_eq!((cc.major, cc.minor), (9, 0));
    // A topology without them: what a driver that does not report them answers.
    assert!(matches!(h100.memory_info(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        h100.is_in_persistent_mode(),
        Err(NvmlError::NotSupported)
    ));
    let pci = h100.pci_info().unwrap();
    assert_eq!(pci.bus_id, "00000001:B3:00.0");
    assert_eq!((pci.domain, pci.bus, pci.device), (1, 0xB3, 0));

    assert!(matches!(
        nvml.device_by_index(2),
        Err(NvmlError::InvalidArg)
    ));
}

#[test]
fn looks_up_gpus_by_uuid_and_bus_id() {
    let nvml = DriverDir::new(Some(&topology())).init().unwrap();
    let uuid_of = |device: Result<Device<'_>, NvmlError>| device.unwrap().uuid().unwrap();

    assert_eq!(uuid_of(nvml.device_by_uuid(H100_UUID)), H100_UUID);
    assert_eq!(uuid_of(nvml.device_by_uuid(MIG_UUIDS[1])), MIG_UUIDS[1]);
    assert!(matches!(
        nvml.device_by_uuid("GPU-00000000-0000-0000-0000-000000000000"),
        Err(NvmlError::NotFound)
    ));

    for bus_id in ["00000001:B3:00.0", "0001:b3:00.0", "1:b3:0.0"] {
        assert_eq!(
            uuid_of(nvml.device_by_pci_bus_id(bus_id)),
            H100_UUID,
            "{bus_id}"
        );
    }
    assert_eq!(
        uuid_of(nvml.device_by_pci_bus_id("0000:18:00.0")),
        A100_UUID
    );
    assert!(matches!(
        nvml.device_by_pci_bus_id("0000:19:00.0"),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        nvml.device_by_pci_bus_id("not a bus id"),
        Err(NvmlError::InvalidArg)
    ));
}

#[test]
fn enumerates_mig_devices() {
    let nvml = DriverDir::new(Some(&topology())).init().unwrap();
    let a100 = nvml.device_by_index(0).unwrap();
    let mode = a100.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    assert_eq!(a100.mig_device_count().unwrap(), 7);
    assert!(!a100.mig_is_mig_device_handle().unwrap());

    for (index, uuid) in MIG_UUIDS.iter().enumerate() {
        let mig = a100.mig_device_by_index(index as u32).unwrap();
        assert_eq!(mig.uuid().unwrap(), *uuid);
        assert_eq!(mig.index().unwrap(), index as u32);
        assert!(mig.mig_is_mig_device_handle().unwrap());
        assert_eq!(mig.mig_parent_device().unwrap().uuid().unwrap(), A100_UUID);
        assert_eq!(mig.pci_info().unwrap().bus_id, "00000000:18:00.0");
        assert!(matches!(mig.minor_number(), Err(NvmlError::NotSupported)));
    }
    assert_eq!(
        a100.mig_device_by_index(0).unwrap().name().unwrap(),
        "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    );
    assert!(matches!(
        a100.mig_device_by_index(2),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        a100.mig_device_by_index(7),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        a100.mig_parent_device(),
        Err(NvmlError::InvalidArg)
    ));

    let h100 = nvml.device_by_index(1).unwrap();
    let mode = h100.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (0, 0));
    assert_eq!(h100.mig_device_count().unwrap(), 0);
    assert!(matches!(
        h100.mig_device_by_index(0),
        Err(NvmlError::NotSupported)
    ));
}

#[test]
fn reports_instance_ids_through_raw_calls() {
    let nvml = DriverDir::new(Some(&topology())).init().unwrap();
    let lib = nvml.lib();
    let a100 = nvml.device_by_index(0).unwrap();
    let instance_ids = |device: &Device<'_>| {
        let (mut gi, mut ci) = (u32::MAX, u32::MAX);
        // SAFETY: a live handle from this library and valid out pointers.
        let status = unsafe {
            (
                lib.nvmlDeviceGetGpuInstanceId(device.handle(), &mut gi),
                lib.nvmlDeviceGetComputeInstanceId(device.handle(), &mut ci),
            )
        };
        (status, gi, ci)
    };

    assert_eq!(
        instance_ids(&a100.mig_device_by_index(0).unwrap()),
        ((0, 0), 1, 0)
    );
    assert_eq!(
        instance_ids(&a100.mig_device_by_index(1).unwrap()),
        ((0, 0), 2, 0)
    );
    let not_supported = 3;
    assert_eq!(instance_ids(&a100).0, (not_supported, not_supported));

    let mig = a100.mig_device_by_index(1).unwrap();
    let mut parent = std::ptr::null_mut();
    // SAFETY: as above.
    let status =
        unsafe { lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig.handle(), &mut parent) };
    assert_eq!(status, 0);
    // SAFETY: as above.
    assert_eq!(parent, unsafe { a100.handle() });
}

#[test]
fn short_string_buffers_are_insufficient_size() {
    let nvml = DriverDir::new(Some(&topology())).init().unwrap();
    let device = nvml.device_by_index(0).unwrap();
    let mut exact = [0 as c_char; A100_UUID.len() + 1];
    let mut short = [0 as c_char; A100_UUID.len()];
    // SAFETY: a live handle and buffers of the lengths passed.
    let (fits, too_short) = unsafe {
        (
            nvml.lib().nvmlDeviceGetUUID(
                device.handle(),
                exact.as_mut_ptr(),
                exact.len() as c_uint,
            ),
            nvml.lib().nvmlDeviceGetUUID(
                device.handle(),
                short.as_mut_ptr(),
                short.len() as c_uint,
            ),
        )
    };
    assert_eq!((fits, too_short), (0, 7));
}

#[test]
fn init_error_fails_init_with_that_error() {
    for (code, expected) in [
        (9, "DriverNotLoaded"),
        (4, "NoPermission"),
        (999, "Unknown"),
    ] {
        let error = DriverDir::new(Some(&with_field("init_error", json!(code))))
            .init()
            .err();
        assert_eq!(
            error.map(|e| format!("{e:?}")).as_deref(),
            Some(expected),
            "init_error {code}"
        );
    }
}

#[test]
fn init_delay_ms_delays_init() {
    let driver = DriverDir::new(Some(&with_field("init_delay_ms", json!(400))));
    let started = Instant::now();
    let nvml = driver.init().unwrap();
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(400),
        "init took only {elapsed:?}"
    );
    assert_eq!(nvml.device_count().unwrap(), 2);
}

#[test]
fn missing_or_malformed_topology_fails_init() {
    assert!(matches!(
        DriverDir::new(None).init(),
        Err(NvmlError::DriverNotLoaded)
    ));
    assert!(matches!(
        DriverDir::new(Some(&json!({"gpus": []}))).init(),
        Err(NvmlError::Unknown)
    ));
}

/// Raw C entry points, looked up without nvml-wrapper so they can run before init.
struct RawLibrary(*mut libc::c_void);

impl RawLibrary {
    fn open(path: &Path) -> Self {
        let path = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string; the mock's initialisers have no preconditions.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen mock");
        Self(handle)
    }

    fn symbol(&self, name: &str) -> *mut libc::c_void {
        let name = CString::new(name).unwrap();
        // SAFETY: a live handle and a valid C string.
        let symbol = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        assert!(!symbol.is_null(), "missing symbol {name:?}");
        symbol
    }

    fn call(&self, name: &str) -> c_uint {
        // SAFETY: every name passed here is an NVML function taking no arguments.
        unsafe {
            std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn() -> c_uint>(
                self.symbol(name),
            )()
        }
    }

    fn device_count(&self) -> (c_uint, c_uint) {
        let mut count = c_uint::MAX;
        // SAFETY: nvmlDeviceGetCount_v2 takes one unsigned int out pointer.
        let status = unsafe {
            let function: unsafe extern "C" fn(*mut c_uint) -> c_uint =
                std::mem::transmute(self.symbol("nvmlDeviceGetCount_v2"));
            function(&mut count)
        };
        (status, count)
    }
}

impl Drop for RawLibrary {
    fn drop(&mut self) {
        // SAFETY: the handle came from dlopen and no symbol outlives this value.
        unsafe { libc::dlclose(self.0) };
    }
}

#[test]
fn init_is_reference_counted() {
    let driver = DriverDir::new(Some(&topology()));
    let raw = RawLibrary::open(&driver.library());
    let (uninitialized, success) = (1, 0);
    assert_eq!(raw.device_count().0, uninitialized, "before init");
    assert_eq!(
        raw.call("nvmlShutdown"),
        uninitialized,
        "shutdown before init"
    );

    for init in ["nvmlInit_v2", "nvmlInit"] {
        assert_eq!(raw.call(init), success);
    }
    assert_eq!(raw.call("nvmlShutdown"), success);
    assert_eq!(
        raw.device_count(),
        (success, 2),
        "one init still outstanding"
    );
    assert_eq!(raw.call("nvmlShutdown"), success);
    assert_eq!(
        raw.device_count().0,
        uninitialized,
        "after the last shutdown"
    );

    // nvml-wrapper's handle shares the library (same path), and works after re-init,
    // through nvmlInit_v2 and nvmlInitWithFlags alike.
    let nvml = driver.init().unwrap();
    let with_flags = Nvml::builder()
        .lib_path(driver.library().as_os_str())
        .flags(InitFlags::NO_GPUS)
        .init()
        .unwrap();
    assert_eq!(nvml.device_count().unwrap(), 2);
    drop(with_flags);
    assert_eq!(raw.device_count(), (success, 2));
}

#[test]
fn serves_concurrent_callers() {
    let driver = DriverDir::new(Some(&topology()));
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for _ in 0..20 {
                    let nvml = driver.init().unwrap();
                    let device = nvml.device_by_uuid(H100_UUID).unwrap();
                    assert_eq!(device.pci_info().unwrap().bus_id, "00000001:B3:00.0");
                }
            });
        }
    });
}

#[test]
fn error_strings_match_nvml() {
    let driver = DriverDir::new(Some(&topology()));
    let raw = RawLibrary::open(&driver.library());
    // SAFETY: nvmlErrorString takes an nvmlReturn_t and returns a static C string.
    let describe = |code: c_uint| unsafe {
        let function: unsafe extern "C" fn(c_uint) -> *const c_char =
            std::mem::transmute(raw.symbol("nvmlErrorString"));
        std::ffi::CStr::from_ptr(function(code))
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(describe(0), "Success");
    assert_eq!(describe(9), "Driver Not Loaded");
    assert_eq!(describe(12345), "Unknown Error");
}

#[test]
fn cuda_driver_version_v1_matches_v2() {
    let driver = DriverDir::new(Some(&topology()));
    let _nvml = driver.init().unwrap();
    let raw = RawLibrary::open(&driver.library());
    for name in [
        "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
    ] {
        let mut version: c_int = 0;
        // SAFETY: both take one int out pointer.
        let status = unsafe {
            let function: unsafe extern "C" fn(*mut c_int) -> c_uint =
                std::mem::transmute(raw.symbol(name));
            function(&mut version)
        };
        assert_eq!((status, version), (0, 12040), "{name}");
    }
}
