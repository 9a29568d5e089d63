//! An NRI plugin that sets HELLO_FROM=<pod namespace> in every container it sees created.
//!
//! Run it beside an engine: `cargo run -p nvhook-nri --example hello -- [SOCKET]`, or copy
//! the binary into the engine's plugin directory as `50-hello` and restart the engine.

use nvhook_nri::api::{
    Container, ContainerAdjustment, CreateContainerResponse, Event, EventMask, KeyValue, PodSandbox,
};
use nvhook_nri::{Configuration, HandlerError, Plugin, Stub};
use std::path::PathBuf;

struct Hello;

impl Plugin for Hello {
    fn configure(&mut self, config: &Configuration) -> Result<EventMask, HandlerError> {
        eprintln!(
            "hello: configured by {} {}",
            config.runtime_name, config.runtime_version
        );
        Ok(EventMask::of(&[Event::CreateContainer]))
    }

    fn synchronize(
        &mut self,
        pods: Vec<PodSandbox>,
        containers: Vec<Container>,
    ) -> Result<Vec<nvhook_nri::api::ContainerUpdate>, HandlerError> {
        eprintln!(
            "hello: synchronized {} pods, {} containers",
            pods.len(),
            containers.len()
        );
        Ok(Vec::new())
    }

    fn create_container(
        &mut self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<CreateContainerResponse, HandlerError> {
        eprintln!("hello: creating {}/{}", pod.name, container.name);
        let adjust = ContainerAdjustment {
            env: vec![KeyValue {
                key: "HELLO_FROM".into(),
                value: pod.namespace.clone(),
            }],
            ..Default::default()
        };
        Ok(CreateContainerResponse {
            adjust: Some(adjust),
            ..Default::default()
        })
    }
}

fn main() {
    let socket = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| nvhook_nri::DEFAULT_SOCKET.into());
    let result = Stub::from_env("hello", "50", &socket).and_then(|stub| stub.run(&mut Hello));
    if let Err(e) = result {
        eprintln!("hello: {e}");
        std::process::exit(1);
    }
}
