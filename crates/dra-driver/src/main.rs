//! `nvhook-dra`: the kubelet plugin of nvhook's DRA driver. It registers with the kubelet as
//! NVIDIA's `gpu.nvidia.com`, reads each claim the kubelet asks it to prepare from the API
//! server, and answers with the CDI ids of a spec it writes for exactly the claim's devices.

mod driver;
mod slices;

use anyhow::{Context, Result};
use clap::Parser;
use k8s_openapi::api::resource::v1::ResourceSlice;
use nvhook::dra::DRIVER_NAME;
use nvhook_dra::{KUBELET_PLUGINS_DIR, KUBELET_REGISTRY_DIR, PluginOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// nvhook's DRA kubelet plugin for GPUs.
#[derive(Debug, Parser)]
#[command(name = "nvhook-dra", version)]
struct Args {
    /// This node's name, as the kubelet registers it: the name of its pool of devices.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// nvhook's config file.
    #[arg(long, env = "NVHOOK_CONFIG")]
    config: Option<PathBuf>,
    /// Where the per-claim CDI specs go: a directory the container engine reads specs from.
    #[arg(long, env = "CDI_ROOT", default_value = "/var/run/cdi")]
    cdi_root: PathBuf,
    /// The kubelet's plugin registry directory.
    #[arg(long, env = "KUBELET_REGISTRAR_DIRECTORY_PATH", default_value = KUBELET_REGISTRY_DIR)]
    registry_dir: PathBuf,
    /// The kubelet's plugins directory; the plugin's own is `<this>/gpu.nvidia.com`.
    #[arg(long, env = "KUBELET_PLUGINS_DIRECTORY_PATH", default_value = KUBELET_PLUGINS_DIR)]
    plugins_dir: PathBuf,
    /// The API server's URL, reached with no credentials (a test's); without it, the
    /// in-cluster service account or KUBECONFIG, as kubectl finds them.
    #[arg(long)]
    api_server: Option<String>,
    /// Offers each GPU in MIG mode as partitionable devices, one for every place each MIG
    /// profile can take, and makes the MIG device when a claim for one is prepared (NVIDIA's
    /// DynamicMIG). The cluster must serve partitionable devices: Kubernetes 1.35 or newer with
    /// the DRAPartitionableDevices feature gate, on by default from 1.36. Without it, a GPU in
    /// MIG mode is offered as the MIG devices it has.
    #[arg(long, env = "NVHOOK_DRA_DYNAMIC_MIG")]
    dynamic_mig: bool,
    /// How often the node's devices are looked at again, to keep its ResourceSlice current.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    resync: u64,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Deletes this node's ResourceSlices of gpu.nvidia.com and exits: for an uninstall that
    /// leaves no kubelet plugin to unregister (the kubelet deletes them when the plugin goes).
    RemoveSlices,
}

fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvhook-dra: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    let config = nvhook::config::load(args.config.as_deref(), None)?;
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    let options = PluginOptions {
        registry_dir: args.registry_dir,
        plugin_dir: args.plugins_dir.join(DRIVER_NAME),
        health_interval: Some(Duration::from_secs(5)),
        ..PluginOptions::new(DRIVER_NAME)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the API client's runtime")?;
    let client = runtime.block_on(driver::client(args.api_server.as_deref()))?;
    let slices: kube::Api<ResourceSlice> = kube::Api::all(client.clone());
    if let Some(Command::RemoveSlices) = args.command {
        return runtime.block_on(slices::remove(&slices, &args.node_name));
    }
    let mut claims = nvhook::dra::claims::Claims::new(
        config,
        args.config,
        &args.node_name,
        &args.cdi_root,
        &options.plugin_dir,
    );
    claims.dynamic_mig = args.dynamic_mig;
    let driver = Arc::new(driver::GpuDriver::new(
        claims,
        client,
        runtime.handle().clone(),
    ));
    let server = nvhook_dra::start(driver.clone(), &options)?;
    runtime.spawn(keep_slice_current(
        driver,
        slices,
        args.node_name.clone(),
        Duration::from_secs(args.resync),
    ));
    tracing::info!(
        node = %args.node_name,
        registration = %options.registration_socket().display(),
        "nvhook-dra serving"
    );
    // Until the kubelet's DaemonSet stops the pod: then both sockets go, and the kubelet's
    // watcher forgets the plugin.
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok::<(), std::io::Error>(())
    })?;
    server.stop()?;
    Ok(())
}

/// Publishes the node's ResourceSlice, then looks at the node's devices again every `every`
/// and republishes what changed (a GPU lost, a driver upgrade). A failure is logged and tried
/// again: the API server may come back, and claims already prepared keep working meanwhile.
async fn keep_slice_current(
    driver: Arc<driver::GpuDriver>,
    api: kube::Api<ResourceSlice>,
    node: String,
    every: Duration,
) {
    loop {
        let asked = driver.clone();
        match tokio::task::spawn_blocking(move || asked.offered()).await {
            Ok(Ok((inventory, offered))) => {
                if let Err(e) = slices::publish(&api, &node, &inventory, &offered).await {
                    tracing::warn!("DRA: {e:#}");
                }
            }
            Ok(Err(e)) => tracing::warn!("DRA: the node's devices are not known: {e}"),
            Err(e) => tracing::warn!("DRA: {e}"),
        }
        tokio::time::sleep(every).await;
    }
}
