//! A plugin served by this crate, registered and called by the kubelet double over real gRPC
//! on Unix sockets, for both generations of the DRA service.

use nvhook_dra::kubelet::{Kubelet, KubeletError, Version};
use nvhook_dra::{
    Claim, DeviceHealth, DraError, Driver, Health, PluginOptions, PreparedDevice, api, start,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Prepares a claim named `gpu-N` as device `gpu-N`; any other name is refused. Remembers
/// what it was asked, and reports the health it is told to.
#[derive(Default)]
struct Fake {
    prepared: Mutex<Vec<String>>,
    unprepared: Mutex<Vec<String>>,
    health: Mutex<Vec<DeviceHealth>>,
}

impl Driver for Fake {
    fn prepare(&self, claim: &Claim) -> Result<Vec<PreparedDevice>, String> {
        self.prepared.lock().unwrap().push(claim.uid.clone());
        match claim.name.strip_prefix("gpu-") {
            Some(_) => Ok(vec![PreparedDevice {
                requests: vec!["gpu".into()],
                pool: "node-a".into(),
                device: claim.name.clone(),
                cdi_ids: vec![format!("k8s.gpu.example.com/claim={}", claim.uid)],
            }]),
            None => Err(format!("claim {} names no GPU here", claim.name)),
        }
    }

    fn unprepare(&self, claim: &Claim) -> Result<(), String> {
        self.unprepared.lock().unwrap().push(claim.uid.clone());
        Ok(())
    }

    fn health(&self) -> Vec<DeviceHealth> {
        self.health.lock().unwrap().clone()
    }
}

fn claim(uid: &str, name: &str) -> Claim {
    Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

fn options(dir: &tempfile::TempDir) -> PluginOptions {
    PluginOptions {
        registry_dir: dir.path().join("plugins_registry"),
        plugin_dir: dir.path().join("plugins/gpu.example.com"),
        ..PluginOptions::new("gpu.example.com")
    }
}

fn healthy(device: &str, health: Health) -> DeviceHealth {
    DeviceHealth {
        pool: "node-a".into(),
        device: device.into(),
        health,
        message: String::new(),
    }
}

#[test]
fn the_kubelet_registers_the_plugin_and_prepares_every_claim_it_asks_about() {
    let dir = tempfile::tempdir().unwrap();
    let options = options(&dir);
    let driver = Arc::new(Fake::default());
    let server = start(driver.clone(), &options).expect("the plugin starts");
    assert_eq!(server.registration(), None);

    let kubelet = Kubelet::new().unwrap();
    let plugin = kubelet.register(&options.registration_socket()).unwrap();
    assert_eq!(plugin.info.r#type, "DRAPlugin");
    assert_eq!(plugin.info.name, "gpu.example.com");
    assert_eq!(
        plugin.info.endpoint,
        options.dra_socket().display().to_string()
    );
    assert_eq!(
        plugin.info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert_eq!(plugin.version, Version::V1);
    assert_eq!(server.registration(), Some(Ok(())));

    let claims = [
        claim("u1", "gpu-0"),
        claim("u2", "nic-0"),
        claim("u3", "gpu-1"),
    ];
    let answers = plugin.prepare(&claims).unwrap();
    assert_eq!(answers.len(), 3);
    let devices = answers["u1"].as_ref().unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].device, "gpu-0");
    assert_eq!(devices[0].pool, "node-a");
    assert_eq!(devices[0].requests, ["gpu"]);
    assert_eq!(devices[0].cdi_ids, ["k8s.gpu.example.com/claim=u1"]);
    assert_eq!(answers["u2"], Err("claim nic-0 names no GPU here".into()));
    assert!(answers["u3"].is_ok());
    assert_eq!(*driver.prepared.lock().unwrap(), ["u1", "u2", "u3"]);

    let answers = plugin.unprepare(&claims[..1]).unwrap();
    assert_eq!(answers.len(), 1);
    assert_eq!(answers["u1"], Ok(()));
    assert_eq!(*driver.unprepared.lock().unwrap(), ["u1"]);

    // Stopping takes both sockets away: the kubelet's watcher forgets the plugin.
    server.stop().expect("the plugin stops cleanly");
    assert!(!options.registration_socket().exists());
    assert!(!options.dra_socket().exists());
    assert!(matches!(
        kubelet.register(&options.registration_socket()),
        Err(KubeletError::Connect { .. })
    ));
}

#[test]
fn a_kubelet_before_v1_speaks_v1beta1_to_the_same_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let options = options(&dir);
    let _server = start(Arc::new(Fake::default()), &options).unwrap();
    let kubelet = Kubelet::speaking(Version::V1beta1).unwrap();
    let plugin = kubelet.register(&options.registration_socket()).unwrap();
    assert_eq!(plugin.version, Version::V1beta1);
    let answers = plugin.prepare(&[claim("u1", "gpu-3")]).unwrap();
    assert_eq!(answers["u1"].as_ref().unwrap()[0].device, "gpu-3");
    assert_eq!(
        plugin.unprepare(&[claim("u1", "gpu-3")]).unwrap()["u1"],
        Ok(())
    );
}

#[test]
fn health_is_streamed_at_once_and_again_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let options = PluginOptions {
        health_interval: Some(Duration::from_millis(20)),
        ..options(&dir)
    };
    let driver = Arc::new(Fake::default());
    *driver.health.lock().unwrap() = vec![healthy("gpu-0", Health::Healthy)];
    let _server = start(driver.clone(), &options).unwrap();
    let kubelet = Kubelet::new().unwrap();
    let plugin = kubelet.register(&options.registration_socket()).unwrap();
    assert!(
        plugin
            .info
            .supported_versions
            .contains(&api::SERVICE_HEALTH.to_string())
    );
    let changer = {
        let driver = driver.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            *driver.health.lock().unwrap() = vec![DeviceHealth {
                message: "fell off the bus".into(),
                ..healthy("gpu-0", Health::Unhealthy)
            }];
        })
    };
    let updates = plugin.health_updates(2, Duration::from_secs(10)).unwrap();
    changer.join().unwrap();
    assert_eq!(updates[0], [healthy("gpu-0", Health::Healthy)]);
    assert_eq!(updates[1][0].health, Health::Unhealthy);
    assert_eq!(updates[1][0].message, "fell off the bus");
}

#[test]
fn a_socket_left_by_an_earlier_run_is_replaced_and_anything_else_refused() {
    let dir = tempfile::tempdir().unwrap();
    let options = options(&dir);
    let first = start(Arc::new(Fake::default()), &options).unwrap();
    // A plugin killed without cleaning up leaves its sockets behind.
    std::mem::forget(first);
    let second = start(Arc::new(Fake::default()), &options).expect("stale sockets replaced");
    let kubelet = Kubelet::new().unwrap();
    kubelet.register(&options.registration_socket()).unwrap();
    second.stop().unwrap();

    std::fs::write(options.dra_socket(), "not a socket").unwrap();
    let e = start(Arc::new(Fake::default()), &options)
        .err()
        .expect("a file in the socket's place is refused");
    assert!(matches!(e, DraError::NotASocket { .. }), "{e:?}");
    assert!(e.to_string().contains("dra.sock"), "{e}");
    assert_eq!(
        std::fs::read_to_string(options.dra_socket()).unwrap(),
        "not a socket"
    );
}
