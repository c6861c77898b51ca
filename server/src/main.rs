//! The `ferrohub` command: `serve` runs a hub node; `connection-string` prints credentials.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ferrohub_engine::Store;
use ferrohub_server::config::{Config, DurabilitySetting};
use ferrohub_server::node::{
    self, db_path, event_hubs_connection_string, policy_connection_string,
    provisioning_connection_string,
};
use ferrohub_server::offline;
use tokio_util::sync::CancellationToken;

/// Many small, short-lived allocations per message cross threads (connection task to commit
/// thread and back); mimalloc's thread-local free lists serve them at a fraction of glibc's
/// cost (see docs/performance.md, issue 19's profiles).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "ferrohub",
    version,
    about = "A self-hosted hub that speaks the Azure IoT Hub protocols"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines on stderr: `text` (coloured only on a terminal) or `json` (one object per line).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// `info`, without the AMQP library's own messages: it logs ordinary peer behaviour (a client
/// closing its connection, a session starting) as warnings and errors, which would drown the
/// real ones (and fill the console's recent errors). The hub logs each AMQP connection's and
/// link's outcome itself; `FERROHUB_LOG=info,fe2o3_amqp=debug` brings the library's back.
const DEFAULT_LOG: &str = "info,fe2o3_amqp=off";

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs go to stderr; the level comes from `FERROHUB_LOG` (default [`DEFAULT_LOG`]).
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("FERROHUB_LOG")
        .unwrap_or_else(|_| DEFAULT_LOG.into());
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // The console's overview shows the last warnings and errors, kept beside the log.
    let recent = ferrohub_server::console::recent_log::RecentLog;
    match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .finish()
            .with(recent)
            .init(),
        // Escape codes only where a terminal will render them, never into a log file.
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .finish()
            .with(recent)
            .init(),
    }
}

#[derive(clap::Args)]
struct ServeArgs {
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// TOML configuration file (see docs/config.sample.toml).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Host name for a new hub (default localhost); more names after commas (a DNS alias, an
    /// IP address). An existing hub keeps its own: `host-name set` changes them.
    #[arg(long, value_name = "NAME", value_delimiter = ',')]
    host_name: Vec<String>,
    /// Name for a new hub (default ferrohub).
    #[arg(long)]
    hub_name: Option<String>,
    /// HTTPS listen address (default [::]:443, dual-stack).
    #[arg(long, value_name = "ADDR")]
    https_addr: Option<std::net::SocketAddr>,
    /// MQTT over TLS listen address (default [::]:8883, dual-stack).
    #[arg(long, value_name = "ADDR")]
    mqtt_addr: Option<std::net::SocketAddr>,
    /// MQTT over QUIC listen address, UDP (default [::]:14567, dual-stack).
    #[arg(long, value_name = "ADDR")]
    mqtt_quic_addr: Option<std::net::SocketAddr>,
    /// AMQP over TLS listen address (default [::]:5671, dual-stack).
    #[arg(long, value_name = "ADDR")]
    amqp_addr: Option<std::net::SocketAddr>,
    /// Metrics and health listen address, plain HTTP (default 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Skip the per-commit sync (development only; a crash may lose acknowledged writes).
    #[arg(long)]
    relaxed_durability: bool,
    /// Join a cluster through these NATS servers (repeat the flag, or separate by commas);
    /// sets `[cluster] nats`.
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    nats: Vec<String>,
    /// This node's name in the cluster (`[cluster] node`).
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a hub node; initialises DIR on first start.
    Serve(ServeArgs),
    /// Manage certificate authorities for X.509 CA-signed devices (hub stopped; the REST API
    /// `/certificates` does the same while it runs).
    Ca {
        #[command(subcommand)]
        action: CaAction,
    },
    /// Print a connection string for a policy, a device or a module.
    ConnectionString {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        /// Policy name (default iothubowner).
        #[arg(long, conflicts_with = "device")]
        policy: Option<String>,
        /// Device id: print the device's connection string.
        #[arg(long)]
        device: Option<String>,
        /// Module id (with --device).
        #[arg(long, requires = "device")]
        module: Option<String>,
        /// Print the policy's connection string for the built-in endpoint's Event Hubs form
        /// (`Endpoint=sb://...;EntityPath={hub name}`), for Event Hubs clients.
        #[arg(long, conflicts_with = "device")]
        event_hubs: bool,
        /// Print the provisioning service's connection string (policy
        /// provisioningserviceowner unless --policy names another provisioning policy).
        #[arg(long, conflicts_with_all = ["device", "event_hubs", "id_scope"])]
        provisioning: bool,
        /// Print the provisioning service's ID scope alone.
        #[arg(long, conflicts_with_all = ["device", "event_hubs", "policy"])]
        id_scope: bool,
    },
    /// Export the hub (settings, policies, CAs, routing, every identity with its twin, its TLS
    /// identity) to a directory or blob container, with the hub stopped: a path, `file:///dir`
    /// or an Azure container SAS URI.
    Export {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        /// Directory or container URI to write hub.json and devices.txt into.
        #[arg(long, value_name = "PATH|URI")]
        to: String,
        /// Write null authentication (such an export cannot be restored, only imported).
        #[arg(long)]
        exclude_keys: bool,
        /// Leave out the hub's CA and server key: a hub restored from it makes a new CA, which
        /// devices must then be given.
        #[arg(long)]
        exclude_tls: bool,
    },
    /// Restore an export into an empty data directory (the hub stopped).
    Restore {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        /// Directory or container URI holding hub.json and devices.txt.
        #[arg(long, value_name = "PATH|URI")]
        from: String,
    },
    /// Copy the whole data directory (queues and partitions included) into a new directory
    /// that `serve` runs as it is. With the hub running, the running hub makes the copy (an
    /// online backup, consistent to one point in time).
    Backup {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        #[arg(long, value_name = "DIR")]
        to: PathBuf,
        /// Leave out the hub's CA and server key (see `export --exclude-tls`).
        #[arg(long)]
        exclude_tls: bool,
    },
    /// Show or change the hub's host names (changing them re-issues the server certificate
    /// from the same CA; the hub stopped).
    HostName {
        #[command(subcommand)]
        action: HostNameAction,
    },
    /// What a data directory holds: host names, hub name, CA and its fingerprint, the served
    /// certificate, version, devices and storage size (works while the hub runs).
    Info {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum HostNameAction {
    /// Make NAME the hub's host name (connection strings carry it), and `--also` names the
    /// others it answers to; re-issues the server certificate from the hub's CA.
    Set {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        name: String,
        /// Further names (repeat, or separate by commas): a DNS alias, an IP address.
        #[arg(long, value_name = "NAME", value_delimiter = ',')]
        also: Vec<String>,
    },
    /// Print the host name, then the others, one per line.
    Show {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum CaAction {
    /// Register (or replace) a CA certificate from a PEM file.
    Add {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long, value_name = "FILE")]
        pem: PathBuf,
    },
    /// List registered CAs.
    List {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
    },
    /// Remove a CA.
    Remove {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        #[arg(long)]
        name: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Ca { action } => ca(action),
        Command::Export {
            data_dir,
            to,
            exclude_keys,
            exclude_tls,
        } => offline::export(&data_dir, &to, exclude_keys, tls_identity(exclude_tls)).map(|n| {
            eprintln!(
                "exported {n} devices with their modules to {}",
                ferrohub_server::blob::redact(&to)
            );
            if exclude_tls {
                eprintln!(
                    "WARNING: the export holds no TLS identity: restored from it, {}",
                    offline::NEW_CA_WARNING
                );
            }
        }),
        Command::Restore { data_dir, from } => offline::restore(&data_dir, &from).map(|r| {
            eprintln!(
                "restored {} devices with their modules into {}",
                r.devices,
                data_dir.display()
            );
            if r.tls_identity {
                eprintln!("restored the hub's TLS identity: devices that trusted its CA still do");
            } else {
                eprintln!(
                    "WARNING: the export holds no TLS identity: {}",
                    offline::NEW_CA_WARNING
                );
            }
        }),
        Command::Backup {
            data_dir,
            to,
            exclude_tls,
        } => backup(&data_dir, &to, tls_identity(exclude_tls)),
        Command::HostName { action } => match action {
            HostNameAction::Set {
                data_dir,
                name,
                also,
            } => offline::host_name::set(&data_dir, &name, &also).map(|change| {
                eprintln!("{change}");
            }),
            HostNameAction::Show { data_dir } => offline::host_name::show(&data_dir).map(|names| {
                for n in names {
                    println!("{n}");
                }
            }),
        },
        Command::Info { data_dir } => offline::info::info(&data_dir).map(|info| print!("{info}")),
        Command::ConnectionString {
            data_dir,
            policy,
            device,
            module,
            event_hubs,
            provisioning,
            id_scope,
        } => connection_string(
            data_dir,
            policy,
            device,
            module,
            Form::pick(event_hubs, provisioning, id_scope),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferrohub: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn tls_identity(exclude: bool) -> offline::TlsIdentity {
    if exclude {
        offline::TlsIdentity::Exclude
    } else {
        offline::TlsIdentity::Include
    }
}

/// An offline backup, or, when a hub serves the directory, an online one made by that hub.
fn backup(
    data_dir: &std::path::Path,
    to: &std::path::Path,
    tls: offline::TlsIdentity,
) -> anyhow::Result<()> {
    if ferrohub_server::control::serving(data_dir) {
        let to = std::path::absolute(to)?;
        let made = ferrohub_server::control::request_backup(data_dir, &to, tls)?;
        eprintln!(
            "backup: made online by the running hub in {}",
            made.display()
        );
        if tls == offline::TlsIdentity::Exclude {
            eprintln!(
                "backup: without the TLS identity: {}",
                offline::NEW_CA_WARNING
            );
        }
        return Ok(());
    }
    offline::backup(data_dir, to, tls).map(drop)
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs {
        data_dir,
        config: config_file,
        host_name,
        hub_name,
        https_addr,
        mqtt_addr,
        mqtt_quic_addr,
        amqp_addr,
        metrics_addr,
        relaxed_durability: relaxed,
        nats,
        node_name,
    } = args;
    let mut config = match &config_file {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if let Some((first, others)) = host_name.split_first() {
        config.hub.host_name = Some(first.clone());
        config.hub.other_host_names = others.to_vec();
    }
    if let Some(n) = hub_name {
        config.hub.name = n;
    }
    if let Some(a) = https_addr {
        config.listeners.https = a;
    }
    if let Some(a) = mqtt_addr {
        config.listeners.mqtt = a;
    }
    if let Some(a) = mqtt_quic_addr {
        config.listeners.mqtt_quic = a;
    }
    if let Some(a) = amqp_addr {
        config.listeners.amqp = a;
    }
    if let Some(a) = metrics_addr {
        config.listeners.metrics = a;
    }
    if relaxed {
        config.storage.durability = DurabilitySetting::Relaxed;
    }
    if !nats.is_empty() {
        config.cluster.nats = nats;
    }
    if let Some(n) = node_name {
        config.cluster.node = n;
    }
    // The runtime's size comes from the configuration, so check it first (tokio panics on 0).
    config.validate()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(config.storage.engine_threads)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        let signal_token = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            signal_token.cancel();
        });
        node::serve(&data_dir, config, shutdown).await
    })?;
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    // SIGHUP reloads the served certificate (tls::serving); taking it here keeps its default
    // action (ending the process) away before the listeners run.
    if let Ok(mut hangup) = signal(SignalKind::hangup()) {
        tokio::spawn(async move { while hangup.recv().await.is_some() {} });
    }
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Which connection string `connection-string` prints for a policy.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    Hub,
    EventHubs,
    Provisioning,
    IdScope,
}

impl Form {
    fn pick(event_hubs: bool, provisioning: bool, id_scope: bool) -> Form {
        match (event_hubs, provisioning, id_scope) {
            (true, _, _) => Form::EventHubs,
            (_, true, _) => Form::Provisioning,
            (_, _, true) => Form::IdScope,
            _ => Form::Hub,
        }
    }
}

fn connection_string(
    data_dir: PathBuf,
    policy: Option<String>,
    device: Option<String>,
    module: Option<String>,
    form: Form,
) -> anyhow::Result<()> {
    // Read-only, so it works while a node is serving the same directory.
    let store = Store::open_read_only(&db_path(&data_dir))?;
    let hub = store
        .hub_settings()?
        .ok_or_else(|| anyhow::anyhow!("{} holds no initialised hub", data_dir.display()))?;
    let line = match device {
        None if form == Form::IdScope => hub
            .provisioning
            .as_ref()
            .map(|p| p.id_scope.clone())
            .ok_or_else(|| anyhow::anyhow!("the hub has no ID scope yet: start it once"))?,
        None => {
            let default = match form {
                Form::Provisioning => "provisioningserviceowner",
                _ => "iothubowner",
            };
            let name = policy.unwrap_or_else(|| default.into());
            let line = match form {
                Form::EventHubs => event_hubs_connection_string(&hub, &name),
                Form::Provisioning => provisioning_connection_string(&hub, &name),
                _ => policy_connection_string(&hub, &name),
            };
            line.ok_or_else(|| anyhow::anyhow!("no policy named {name:?}"))?
        }
        Some(d) => {
            let identity = match &module {
                Some(m) => store.get_module(&d, m)?,
                None => store.get_device(&d)?,
            };
            let keys = identity
                .authentication
                .symmetric_keys
                .ok_or_else(|| anyhow::anyhow!("{d} does not use symmetric keys"))?;
            let module_part = module.map(|m| format!(";ModuleId={m}")).unwrap_or_default();
            format!(
                "HostName={};DeviceId={d}{module_part};SharedAccessKey={}",
                hub.host_name, keys.primary_key
            )
        }
    };
    println!("{line}");
    Ok(())
}

fn ca(action: CaAction) -> anyhow::Result<()> {
    use ferrohub_engine::hub::CertificateAuthority;
    let open = |dir: &PathBuf| -> anyhow::Result<Store> {
        Store::open(&db_path(dir), ferrohub_engine::StoreConfig::default()).map_err(|e| match e {
            ferrohub_engine::OpenError::InUse { .. } => {
                anyhow::anyhow!("{e} (is the hub running? use the REST API /certificates then)")
            }
            other => anyhow::anyhow!(other),
        })
    };
    match action {
        CaAction::Add {
            data_dir,
            name,
            pem,
        } => {
            let der = ferrohub_server::x509::parse_ca(&std::fs::read(&pem)?)?;
            let store = open(&data_dir)?;
            let created = ferrohub_engine::UnixMillis(chrono::Utc::now().timestamp_millis());
            store.put_certificate_authority(&CertificateAuthority {
                name: name.clone(),
                der,
                created,
            })?;
            store.close()?;
            println!("registered CA {name}");
        }
        CaAction::List { data_dir } => {
            let store = Store::open_read_only(&db_path(&data_dir))?;
            for ca in store.list_certificate_authorities()? {
                let (sha1, _) = ferrohub_server::x509::thumbprints(
                    &rustls::pki_types::CertificateDer::from(ca.der),
                );
                println!("{}\t{sha1}", ca.name);
            }
        }
        CaAction::Remove { data_dir, name } => {
            let store = open(&data_dir)?;
            let existed = store.delete_certificate_authority(&name)?;
            store.close()?;
            anyhow::ensure!(existed, "no CA named {name:?}");
            println!("removed CA {name}");
        }
    }
    Ok(())
}
