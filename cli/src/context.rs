//! `dpctl config`: one file of named clusters, in the spirit of kubeconfig, so that commands
//! need not repeat endpoints, the CA, the domain and a token. A context's values become the
//! defaults of the cluster flags: a flag given, then a `DPCAP_*` variable, then the context,
//! then the built-in default. The file is `$DPCAP_CONFIG`, else
//! `$XDG_CONFIG_HOME/dpcap/config.yaml`, else `~/.config/dpcap/config.yaml`; `--context NAME`
//! (or `DPCAP_CONTEXT`) picks a context for one command. Tokens are never stored in it: a
//! context names a token file (mode 0600 advised), read when a command runs.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use clap::Subcommand;
use serde::{Deserialize, Serialize};

/// One cluster: where its services are and how to reach them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Context {
    /// The coordinator's endpoint (`https://host:7071`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator: Option<String>,
    /// The accountant's endpoint (`dpctl dataset budget`, `dpctl audit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accountant: Option<String>,
    /// The CA bundle that signed the servers' certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
    /// The name the servers' certificates carry, when it is not the endpoint's host (a
    /// port-forward to 127.0.0.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_domain: Option<String>,
    /// A file holding the bearer token (its first line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
}

/// The config file: named contexts and the current one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Config {
    /// The context commands use unless `--context` says otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_context: Option<String>,
    /// Contexts by name.
    #[serde(default)]
    pub contexts: BTreeMap<String, Context>,
}

/// `dpctl config …`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Create or update a context from KEY=VALUE pairs (coordinator, accountant, tls-ca,
    /// tls-domain, token-file; an empty VALUE removes the key).
    SetContext {
        /// The context's name.
        name: String,
        /// KEY=VALUE pairs.
        settings: Vec<String>,
    },
    /// Make NAME the current context.
    UseContext {
        /// The context's name.
        name: String,
    },
    /// List the contexts (`*` marks the current one).
    GetContexts,
    /// Print the current context's name.
    CurrentContext,
}

/// Where the config file is.
pub fn path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("DPCAP_CONFIG") {
        return Some(path.into());
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))?;
    Some(base.join("dpcap").join("config.yaml"))
}

impl Config {
    /// The file at `path()`, or an empty config when there is none.
    pub fn load() -> Result<Self> {
        let Some(path) = path() else { return Ok(Self::default()) };
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_yaml::from_str(&text).with_context(|| format!("invalid dpctl config {}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e).with_context(|| format!("reading dpctl config {}", path.display())),
        }
    }

    fn save(&self) -> Result<PathBuf> {
        let path = path().context("no config path: set DPCAP_CONFIG or HOME")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&path, serde_yaml::to_string(self)?).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// The context a command uses: `chosen` (`--context`, `DPCAP_CONTEXT`), else the current
    /// one; None when neither is set. A name the file lacks is an error.
    pub fn active(&self, chosen: Option<&str>) -> Result<Option<(&str, &Context)>> {
        let Some(name) = chosen.or(self.current_context.as_deref()) else { return Ok(None) };
        match self.contexts.get_key_value(name) {
            Some((name, context)) => Ok(Some((name.as_str(), context))),
            None => bail!(
                "context {name:?} is not in the dpctl config ({}): `dpctl config get-contexts` lists them",
                path().map_or_else(|| "no file".into(), |p| p.display().to_string())
            ),
        }
    }
}

impl Context {
    fn set(&mut self, setting: &str) -> Result<()> {
        let (key, value) = setting.split_once('=').with_context(|| format!("{setting:?} is not KEY=VALUE"))?;
        let value = (!value.is_empty()).then(|| value.to_owned());
        match key {
            "coordinator" => self.coordinator = value,
            "accountant" => self.accountant = value,
            "tls-ca" => self.tls_ca = value.map(PathBuf::from),
            "tls-domain" => self.tls_domain = value,
            "token-file" => self.token_file = value.map(PathBuf::from),
            other => bail!("unknown context key {other:?}: coordinator, accountant, tls-ca, tls-domain or token-file"),
        }
        Ok(())
    }

    /// The token its token file holds (first line, trimmed).
    pub fn token(&self) -> Result<Option<String>> {
        let Some(file) = &self.token_file else { return Ok(None) };
        let text = std::fs::read_to_string(file).with_context(|| format!("reading token-file {}", file.display()))?;
        Ok(text.lines().next().map(|l| l.trim().to_owned()).filter(|t| !t.is_empty()))
    }
}

/// The context's token, for a command that talks to the context's endpoints only.
fn token(context: &Context, args: &[String]) -> Option<String> {
    if endpoint_given(args) {
        return None;
    }
    context.token().unwrap_or_else(|e| {
        eprintln!("warning: {e:#}: the context's token is not used");
        None
    })
}

/// Runs one `dpctl config` command.
pub fn run(command: ConfigCommand) -> Result<()> {
    let mut config = Config::load()?;
    match command {
        ConfigCommand::SetContext { name, settings } => {
            let context = config.contexts.entry(name.clone()).or_default();
            for setting in &settings {
                context.set(setting)?;
            }
            if config.current_context.is_none() {
                config.current_context = Some(name.clone());
            }
            let path = config.save()?;
            outln!("context {name} saved in {}", path.display());
        }
        ConfigCommand::UseContext { name } => {
            config.active(Some(&name))?;
            config.current_context = Some(name.clone());
            config.save()?;
            outln!("current context: {name}");
        }
        ConfigCommand::GetContexts => {
            if config.contexts.is_empty() {
                let file = path().map_or_else(|| "(no HOME)".into(), |p| p.display().to_string());
                eprintln!(
                    "no contexts in {file}: create one with `dpctl config set-context NAME coordinator=URL accountant=URL`"
                );
            }
            for (name, context) in &config.contexts {
                let mark = if config.current_context.as_deref() == Some(name) { "*" } else { " " };
                let coordinator = context.coordinator.as_deref().unwrap_or("-");
                let accountant = context.accountant.as_deref().unwrap_or("-");
                outln!("{mark} {name}  coordinator {coordinator}  accountant {accountant}");
            }
        }
        ConfigCommand::CurrentContext => match &config.current_context {
            Some(name) => outln!("{name}"),
            None => bail!("no current context: `dpctl config use-context NAME`"),
        },
    }
    Ok(())
}

/// The `--context NAME` (or `--context=NAME`) among `args`, else `DPCAP_CONTEXT`: read before
/// the command line is parsed, because the context supplies the parser's defaults.
pub fn chosen(args: &[String]) -> Option<String> {
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--context" {
            return args.next().cloned();
        }
        if let Some(name) = arg.strip_prefix("--context=") {
            return Some(name.to_owned());
        }
    }
    std::env::var("DPCAP_CONTEXT").ok().filter(|c| !c.is_empty())
}

/// Whether `args` or the environment name an endpoint other than the context's: the context's
/// token then stays home (it is the context's cluster's credential, never another's).
fn endpoint_given(args: &[String]) -> bool {
    let flag = |name: &str| args.iter().any(|a| a == name || a.starts_with(&format!("{name}=")));
    let env = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    flag("--coordinator") || flag("--accountant") || env("DPCAP_COORDINATOR") || env("DPCAP_ACCOUNTANT")
}

/// `command` with the context's values as the defaults of the cluster flags (the global
/// ones, and `--accountant` where a command has it). The context's token is a default only
/// while every endpoint is the context's; a token file that cannot be read is a warning (the
/// command may need no token, and `dpctl config` must still work to fix the context).
pub fn apply(mut command: clap::Command, context: &Context, args: &[String]) -> clap::Command {
    let default = |value: Option<String>, hide: bool| {
        move |arg: clap::Arg| match &value {
            Some(v) => arg.default_value(v.clone()).hide_default_value(hide),
            None => arg,
        }
    };
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned());
    command = command
        .mut_arg("coordinator", default(context.coordinator.clone(), false))
        .mut_arg("tls_ca", default(path(&context.tls_ca), false))
        .mut_arg("tls_domain", default(context.tls_domain.clone(), false))
        .mut_arg("token", default(token(context, args), true));
    let accountant = default(context.accountant.clone(), false);
    command = command
        .mut_subcommand("dataset", |d| {
            d.mut_subcommand("budget", |b| {
                b.mut_subcommand("set", |s| s.mut_arg("accountant", &accountant))
                    .mut_subcommand("show", |s| s.mut_arg("accountant", &accountant))
            })
        })
        .mut_subcommand("audit", |a| a.mut_arg("accountant", &accountant));
    command
}
