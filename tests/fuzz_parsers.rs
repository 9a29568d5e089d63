//! Fuzzing the parsers that take outside input, with proptest: the OCI state, config.json
//! and its NVIDIA_* values (through the request and the plan), the ld.so.cache reader,
//! nvhook's own config, and the engine-config editors of `nvhook configure`. cargo-fuzz
//! needs a nightly toolchain, which the CI does not have; proptest runs on stable, in the
//! normal test suite, with structure-aware generators plus raw bytes.
//!
//! Every input must give a result or an error, never a panic, and every error is one line
//! without control characters (it ends up in the one line the runtime shows the user).
//!
//! The default run makes proptest's default 256 cases per property; a longer run:
//! `PROPTEST_CASES=100000 cargo test --test fuzz_parsers`. Inputs worth keeping (seeds,
//! and any that found a bug) live in `tests/corpus/<parser>/`, and
//! `corpus_inputs_parse_without_panic` replays them all on every run.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nvhook::config::Config;
use nvhook::configure::{self, Engine, Options};
use nvhook::inventory::Inventory;
use nvhook::oci::{Spec, State};
use nvhook::plan::{self, ImageInfo};
use nvhook::request::{Decision, Request};
use nvhook_ldcache::LdCache;
use nvhook_runtime::{self as runtime_front, Runtimes, ServerSocket};
use proptest::prelude::*;
use serde_json::{Value, json};
use std::os::unix::ffi::OsStrExt;

// ---------------------------------------------------------------- what every input must satisfy

#[track_caller]
fn assert_one_line(parser: &str, input: &dyn std::fmt::Debug, message: &str) {
    assert!(
        !message.chars().any(char::is_control),
        "{parser}: error with a control character for {input:?}: {message:?}"
    );
}

fn check_state(text: &str) {
    if let Err(e) = State::parse(text) {
        assert_one_line("state", &text, &e.to_string());
    }
}

/// config.json, then the request it makes under every policy, then the plan on a
/// simulated 4-GPU node whose GPU 3 has two MIG devices.
fn check_spec(text: &str) {
    let spec = match Spec::parse(text, Path::new("/bundle/config.json")) {
        Ok(spec) => spec,
        Err(e) => return assert_one_line("spec", &text, &e.to_string()),
    };
    // nvhook-runtime hands a create to nvhook only when these bytes may ask for a GPU.
    let may_ask = runtime_front::may_ask_for_gpu(text.as_bytes());
    for config in policies() {
        let decision = Request::decide(&spec, config);
        assert!(
            may_ask || matches!(decision, Ok(Decision::NotRequested)),
            "nvhook-runtime would pass by a config.json nvhook decides on: {text:?}"
        );
        let request = match decision {
            Ok(Decision::Gpu(request)) => *request,
            Ok(_) => continue,
            Err(e) => {
                assert_one_line("request", &text, &e.to_string());
                continue;
            }
        };
        for image in [ImageInfo::default(), DEBIAN_IMAGE] {
            if let Err(e) = plan::build(&request, inventory(), "/", image) {
                assert_one_line("plan", &text, &e.to_string());
            }
        }
    }
}

/// A parsed cache survives a write and a re-read unchanged.
fn check_ldcache(bytes: &[u8]) {
    let cache = match LdCache::parse(bytes) {
        Ok(cache) => cache,
        Err(e) => return assert_one_line("ldcache", &bytes.len(), &e.to_string()),
    };
    let Ok(written) = cache.to_bytes() else {
        return;
    };
    let again = LdCache::parse(&written).expect("a cache nvhook wrote parses");
    assert_eq!(again, cache, "round trip changed the cache");
}

fn check_config(text: &str) {
    let config = match Config::parse(text, Path::new("/etc/nvhook/config.toml")) {
        Ok(config) => config,
        Err(e) => return assert_one_line("config", &text, &e.to_string()),
    };
    // What nvhook-runtime reads of a valid config is what nvhook reads, or it asks nvhook.
    let socket = match runtime_front::server_socket_in_toml(text.as_bytes()) {
        ServerSocket::Default => Some(runtime_front::server::DEFAULT_SOCKET.as_bytes()),
        ServerSocket::Named(path) => Some(path),
        ServerSocket::Unsure => None,
    };
    if let Some(socket) = socket {
        assert_eq!(
            socket,
            config.runtime_server.as_os_str().as_bytes(),
            "nvhook-runtime misreads runtime-server in {text:?}"
        );
    }
    let runtimes: Vec<String> = match runtime_front::runtimes_in_toml(text.as_bytes()) {
        Runtimes::Default => runtime_front::DEFAULT_RUNTIMES.map(String::from).to_vec(),
        Runtimes::Listed(inner) => runtime_front::array_strings(inner)
            .map(|s| String::from_utf8(s.to_vec()).expect("UTF-8 in a valid config"))
            .collect(),
        Runtimes::Unsure => return,
    };
    assert_eq!(
        runtimes, config.runtimes,
        "nvhook-runtime misreads {text:?}"
    );
}

/// `nvhook configure ENGINE` on a file holding `text`: one line on error; otherwise a
/// second run changes nothing, and `--remove` then succeeds too.
fn check_configure(engine: Engine, text: &[u8]) {
    let dir = tempfile::tempdir_in(scratch_root()).expect("tempdir");
    let file = dir.path().join("engine.conf");
    // A drop-in directory a config imports (the corpus holds containerd 2's
    // `/etc/containerd/conf.d/*.toml`) must be the scratch one, never the host's.
    let scratch = format!("{}/", dir.path().display());
    let owned;
    let text = match std::str::from_utf8(text) {
        Ok(t) if t.contains("/etc/") => {
            owned = t.replace("/etc/", &scratch);
            owned.as_bytes()
        }
        _ => text,
    };
    fs::write(&file, text).expect("write engine config");
    let options = |remove| Options {
        engine,
        file: Some(file.clone()),
        runtime_name: "nvidia".into(),
        runtime_path: "/usr/bin/nvhook-runtime".into(),
        allow_missing: true,
        set_as_default: true,
        remove,
        dry_run: false,
        kubernetes_policy: None,
        nri: false,
        engine_version: None,
    };
    match configure::run(&options(false)) {
        Err(e) => {
            assert_one_line("configure", &String::from_utf8_lossy(text), &e.to_string());
            assert_eq!(
                fs::read(&file).expect("read back"),
                text,
                "refused, yet changed"
            );
        }
        Ok(_) => {
            let again = configure::run(&options(false)).expect("a file nvhook wrote is valid");
            assert!(
                again
                    .files
                    .iter()
                    .all(|f| f.applied == configure::Applied::Unchanged),
                "second run changed {:?}: {again}",
                String::from_utf8_lossy(text)
            );
            configure::run(&options(true)).expect("remove what configure added");
        }
    }
}

/// Dispatches a corpus file by its directory name.
fn check(parser: &str, bytes: &[u8]) {
    let text = || String::from_utf8_lossy(bytes).into_owned();
    match parser {
        "state" => check_state(&text()),
        "spec" => check_spec(&text()),
        "ldcache" => check_ldcache(bytes),
        "config" => check_config(&text()),
        "docker" => check_configure(Engine::Docker, bytes),
        "containerd" => check_configure(Engine::Containerd, bytes),
        "crio" => check_configure(Engine::Crio, bytes),
        other => panic!("tests/corpus/{other}: no parser of that name"),
    }
}

// ---------------------------------------------------------------- fixtures

const DEBIAN_IMAGE: ImageInfo = ImageInfo {
    debian: true,
    has_usr_lib64: false,
    has_ldcache: true,
    cuda_compat: None,
};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// `nvhook info --format json` of a simulated node (4 GPUs, GPU 3 in MIG mode).
fn inventory() -> &'static Inventory {
    static INVENTORY: OnceLock<Inventory> = OnceLock::new();
    INVENTORY.get_or_init(|| {
        let text = fs::read_to_string(corpus_dir().join("inventory.json")).expect("inventory");
        serde_json::from_str(&text).expect("inventory.json is an Inventory")
    })
}

/// The default policy, the hardened one, no volume mounts, requirements off, few capabilities.
fn policies() -> &'static [Config] {
    static POLICIES: OnceLock<Vec<Config>> = OnceLock::new();
    POLICIES.get_or_init(|| {
        let base = Config::default();
        vec![
            base.clone(),
            Config {
                accept_env_when_unprivileged: false,
                ..base.clone()
            },
            Config {
                accept_volume_mount_devices: false,
                disable_require: true,
                ..base.clone()
            },
            Config {
                supported_capabilities: vec![nvhook::capability::Capability::Utility],
                ..base
            },
        ]
    })
}

/// Engine configs are written and re-read for every case: on tmpfs when there is one.
fn scratch_root() -> &'static Path {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() { shm } else { Path::new("/tmp") }
}

// ---------------------------------------------------------------- generators

/// Tokens of the NVIDIA_* languages, the id forms, and the characters that split them.
const TOKENS: &[&str] = &[
    "all",
    "none",
    "void",
    "0",
    "1",
    "3",
    "7",
    "3:0",
    "3:1",
    "3:9",
    "-1",
    "4294967296",
    "GPU-58f28dd4-661c-1502-96af-9b20103652d2",
    "GPU-",
    "MIG-",
    "MIG-GPU-x/1/0",
    "0000:18:00.0",
    "00000000:1B:00.0",
    "ffff:ff:ff.f",
    "compute",
    "utility",
    "video",
    "graphics",
    "display",
    "ngx",
    "compat32",
    "cuda",
    "driver",
    "arch",
    "brand",
    "tesla",
    ">=",
    "<=",
    "=",
    "!=",
    "<",
    ">",
    "12.4",
    "550.54.15",
    "8.0",
    "9.9.9.9",
    "1e9",
    "v12",
    "12.4.1-rc",
    ",",
    " ",
    ",,",
    "\n",
    "\t",
    "\0",
    "\u{1b}[31m",
    "é",
    "\u{202e}",
    "true",
    "1",
    "yes",
];

fn token_soup() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec(prop::sample::select(TOKENS), 0..8).prop_map(|t| t.concat()),
        1 => any::<String>(),
    ]
}

const NVIDIA_VARS: &[&str] = &[
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_REQUIRE_CUDA",
    "NVIDIA_REQUIRE_ARCH",
    "NVIDIA_REQUIRE_DRIVER",
    "NVIDIA_REQUIRE_BRAND",
    "NVIDIA_REQUIRE_X",
    "NVIDIA_REQUIRE_JETPACK",
    "NVIDIA_DISABLE_REQUIRE",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "CUDA_VERSION",
];

/// A config.json whose env, device mounts and privileges are drawn from the languages
/// nvhook reads, rendered as JSON text.
fn spec_text() -> impl Strategy<Value = String> {
    let env = prop::collection::vec(
        (prop::sample::select(NVIDIA_VARS), token_soup()).prop_map(|(k, v)| format!("{k}={v}")),
        0..6,
    );
    let mounts = prop::collection::vec(
        (token_soup(), prop::option::of(token_soup())).prop_map(|(id, source)| {
            json!({
                "destination": format!("/var/run/nvidia-container-devices/{id}"),
                "source": source.unwrap_or_else(|| "/dev/null".into()),
                "type": "bind",
            })
        }),
        0..3,
    );
    (env, mounts, any::<bool>(), any::<bool>()).prop_map(|(env, mounts, privileged, root)| {
        let bounding: Vec<&str> = if privileged {
            vec!["CAP_SYS_ADMIN"]
        } else {
            vec![]
        };
        let mut spec = json!({
            "ociVersion": "1.0.2",
            "process": {"env": env, "capabilities": {"bounding": bounding}},
            "mounts": mounts,
        });
        if root {
            spec["root"] = json!({"path": "rootfs"});
        }
        spec.to_string()
    })
}

/// Field names the parsers know, so that random JSON often hits real fields.
const KEYS: &[&str] = &[
    "ociVersion",
    "id",
    "pid",
    "bundle",
    "status",
    "process",
    "env",
    "capabilities",
    "bounding",
    "root",
    "path",
    "readonly",
    "mounts",
    "destination",
    "source",
    "type",
    "linux",
    "devices",
    "rootfsPropagation",
    "major",
    "minor",
    "annotations",
    "runtimes",
    "default-runtime",
    "nvidia",
    "runtimeArgs",
    "\n",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        token_soup().prop_map(Value::from),
        Just(Value::from("/b")),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec(
                (
                    prop_oneof![3 => prop::sample::select(KEYS).prop_map(String::from), 1 => any::<String>()],
                    inner
                ),
                0..5
            )
            .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

/// JSON text: mostly well-formed (random structure), sometimes cut short or raw.
fn json_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => json_value().prop_map(|v| v.to_string()),
        1 => (json_value(), any::<prop::sample::Index>()).prop_map(|(v, cut)| {
            let text = v.to_string();
            let at = cut.index(text.len() + 1);
            text.char_indices().map(|(i, _)| i).chain([text.len()]).find(|&i| i >= at).map_or(text.clone(), |i| text[..i].to_string())
        }),
        1 => any::<String>(),
    ]
}

/// TOML text built from lines with the keys and tables these files have.
fn toml_text(keys: &'static [&'static str]) -> impl Strategy<Value = String> {
    let value = prop_oneof![
        token_soup().prop_map(|s| format!("{s:?}")),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        Just("[\"runc\", \"crun\"]".to_string()),
        Just("{ a = 1 }".to_string()),
        Just("[]".to_string()),
        // containerd 2 with a drop-in directory beside the file (never an absolute path:
        // the fuzzer must not write outside its scratch directory).
        Just("4".to_string()),
        Just("['conf.d/*.toml']".to_string()),
        token_soup(),
    ];
    let line = prop_oneof![
        3 => (prop::sample::select(keys), value).prop_map(|(k, v)| format!("{k} = {v}")),
        1 => prop::sample::select(keys).prop_map(|k| format!("[{k}]")),
        1 => prop::sample::select(keys).prop_map(|k| format!("[[{k}]]")),
        1 => token_soup(),
    ];
    prop::collection::vec(line, 0..8).prop_map(|lines| lines.join("\n"))
}

/// Valid nvhook configs written every way TOML allows, with or without a `runtimes` key:
/// what nvhook-runtime's line scanner must read as nvhook does, or leave to nvhook.
fn valid_nvhook_config() -> impl Strategy<Value = String> {
    let other = prop::sample::select(vec![
        "log-level = \"debug\"",
        "hook-path = '/usr/bin/nvhook' # runtimes = [\"x\"]",
        "driver-root = \"/a]b[\"",
        "supported-capabilities = [\n  \"compute\", # ] [\n  'utility',\n]",
        "supported-capabilities = [\"compute\"]",
        "nvml-timeout-ms = 5000",
        "# runtimes = [\"commented\"]",
        "",
        "   ",
        "log-file = \"\"\"\nruntimes = [\"in-a-string\"]\n\"\"\"",
        "log-file = \"/var/log/\\\"q\\\".log\"",
        "runtime-server = \"/run/s.sock\"",
        "runtime-server = '' # off",
        "\"runtime-server\" = \"/q.sock\"",
    ]);
    let name = prop::sample::select(vec![
        "runc",
        "/usr/local/bin/crun",
        "my runtime",
        "a#b",
        "x,y",
    ]);
    let item = (name, prop::bool::ANY).prop_map(|(n, literal)| {
        if literal {
            format!("'{n}'")
        } else {
            format!("\"{n}\"")
        }
    });
    let runtimes = (
        prop::collection::vec(item, 1..4),
        prop::sample::select(vec!["runtimes", "\"runtimes\"", "  runtimes"]),
        prop::sample::select(vec![", ", ",", ",\n  "]),
        prop::sample::select(vec!["", ",", " # comment", "\r"]),
    )
        .prop_map(|(items, key, sep, tail)| format!("{key} = [{}]{tail}", items.join(sep)));
    (
        prop::collection::vec(other, 0..6),
        prop::option::of(runtimes),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(lines, runtimes, at)| {
            let mut lines: Vec<String> = lines.into_iter().map(String::from).collect();
            if let Some(r) = runtimes {
                let at = at.index(lines.len() + 1);
                lines.insert(at, r);
            }
            lines.join("\n")
        })
}

const NVHOOK_KEYS: &[&str] = &[
    "driver-root",
    "dev-root",
    "proc-root",
    "nvml-library",
    "supported-capabilities",
    "accept-env-when-unprivileged",
    "accept-volume-mount-devices",
    "disable-require",
    "nvml-timeout-ms",
    "log-file",
    "log-level",
    "runtimes",
    "runtime-server",
    "hook-path",
    "\"a\\nb\"",
    "x",
];

const CONTAINERD_KEYS: &[&str] = &[
    "version",
    "imports",
    "plugins",
    "plugins.\"io.containerd.grpc.v1.cri\"",
    "plugins.\"io.containerd.grpc.v1.cri\".containerd",
    "plugins.\"io.containerd.grpc.v1.cri\".containerd.default_runtime_name",
    "plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes",
    "plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia",
    "plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options",
    "plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc",
    "plugins.cri.containerd.runtimes.nvidia",
    "runtime_type",
    "BinaryName",
    "imports",
];

const CRIO_KEYS: &[&str] = &[
    "crio",
    "crio.runtime",
    "crio.runtime.default_runtime",
    "crio.runtime.runtimes",
    "crio.runtime.runtimes.nvidia",
    "crio.runtime.runtimes.nvidia.runtime_path",
    "runtime_path",
    "runtime_type",
    "monitor_path",
];

/// A valid cache with a few driver libraries, then byte edits: flips, overwrites of
/// offsets and counts with extreme values, truncation.
fn mutated_ldcache() -> impl Strategy<Value = Vec<u8>> {
    let seeds: Vec<Vec<u8>> = fs::read_dir(corpus_dir().join("ldcache"))
        .expect("ldcache corpus")
        .map(|e| fs::read(e.expect("entry").path()).expect("read seed"))
        .collect();
    let edit = (
        any::<prop::sample::Index>(),
        prop_oneof![
            any::<u8>().prop_map(|b| vec![b]),
            Just(u32::MAX.to_le_bytes().to_vec()),
            Just(0x7fff_fff0u32.to_le_bytes().to_vec()),
            any::<u32>().prop_map(|n| n.to_le_bytes().to_vec()),
        ],
    );
    (
        prop::sample::select(seeds),
        prop::collection::vec(edit, 0..6),
        prop::option::of(any::<prop::sample::Index>()),
    )
        .prop_map(|(mut bytes, edits, cut)| {
            for (at, patch) in edits {
                let at = at.index(bytes.len());
                for (i, b) in patch.into_iter().enumerate() {
                    if let Some(slot) = bytes.get_mut(at + i) {
                        *slot = b;
                    }
                }
            }
            if let Some(cut) = cut {
                bytes.truncate(cut.index(bytes.len() + 1));
            }
            bytes
        })
}

// ---------------------------------------------------------------- properties

proptest! {
    // A failure prints its minimal input: it goes into tests/corpus/, the one record kept.
    #![proptest_config(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn fuzz_state_text(text in any::<String>()) {
        check_state(&text);
    }

    #[test]
    fn fuzz_state_json(text in json_text()) {
        check_state(&text);
    }

    #[test]
    fn fuzz_spec_json(text in json_text()) {
        check_spec(&text);
    }

    #[test]
    fn fuzz_spec_nvidia_values(text in spec_text()) {
        check_spec(&text);
    }

    #[test]
    fn fuzz_ldcache_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_ldcache(&bytes);
        let mut with_magic = b"glibc-ld.so.cache1.1".to_vec();
        with_magic.extend_from_slice(&bytes);
        check_ldcache(&with_magic);
    }

    #[test]
    fn fuzz_ldcache_mutated(bytes in mutated_ldcache()) {
        check_ldcache(&bytes);
    }

    #[test]
    fn fuzz_nvhook_config(text in toml_text(NVHOOK_KEYS)) {
        check_config(&text);
    }

    #[test]
    fn fuzz_valid_nvhook_config(text in valid_nvhook_config()) {
        check_config(&text);
    }

    #[test]
    fn fuzz_configure_docker(text in json_text()) {
        check_configure(Engine::Docker, text.as_bytes());
    }

    #[test]
    fn fuzz_configure_containerd(text in toml_text(CONTAINERD_KEYS)) {
        check_configure(Engine::Containerd, text.as_bytes());
    }

    #[test]
    fn fuzz_configure_crio(text in toml_text(CRIO_KEYS)) {
        check_configure(Engine::Crio, text.as_bytes());
    }
}

/// Every corpus file through its parser: the seeds, and the inputs that once found a bug.
#[test]
fn corpus_inputs_parse_without_panic() {
    let mut count = 0;
    for dir in fs::read_dir(corpus_dir()).expect("tests/corpus").flatten() {
        if !dir.path().is_dir() {
            continue;
        }
        let parser = dir.file_name().into_string().expect("utf-8 dir name");
        for file in fs::read_dir(dir.path()).expect("corpus dir").flatten() {
            let bytes = fs::read(file.path()).expect("read corpus file");
            let outcome = std::panic::catch_unwind(|| check(&parser, &bytes));
            assert!(outcome.is_ok(), "{} failed", file.path().display());
            count += 1;
        }
    }
    assert!(count >= 20, "only {count} corpus files");
}
