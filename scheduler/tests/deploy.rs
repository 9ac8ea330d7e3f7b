//! The scheduler's deployment files as an operator installs them. `deploy/systemd/`: the unit
//! starts a command line `chime` accepts, reloads the job files with SIGHUP and stops with the
//! graceful SIGTERM; the example settings file and environment file load without an error,
//! name only settings that exist, and give the values the unit's comments promise.
//! `deploy/compose.yaml` and `deploy/docker/` (no container runs on the test machine, so they
//! are checked as files): every command is one the image has and `chime` accepts, every
//! variable a setting, every mounted file present, every job file loads, every scheduler's
//! published port its bind port and scraped by Prometheus.

use std::path::PathBuf;

use chime_scheduler::cli::{Cli, Command};
use chime_scheduler::config::{SETTINGS_KEYS, Settings};
use chime_test_kit::{Unit, deploy_path, env_file};
use clap::Parser;
use yaml_rust2::{Yaml, YamlLoader};

/// `CHIME_*` variables the command line reads itself (not settings).
const CLI_VARIABLES: &[&str] = &["CHIME_CONFIG", "CHIME_LOG_FORMAT", "CHIME_ACTOR"];
/// Where the example environment file says the CA certificate is installed.
const INSTALLED_CA: &str = "/etc/chime/tls/ca.pem";

#[test]
fn the_scheduler_unit_runs_chime_scheduler_reloads_with_sighup_and_stops_gracefully() {
    let unit = Unit::read("systemd/chime-scheduler.service");
    let argv = unit.argv("Service", "ExecStart");
    assert_eq!(argv[0], "/usr/local/bin/chime", "{argv:?}");
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("chime refuses {argv:?}: {e}"));
    assert!(
        matches!(cli.command, Command::Scheduler { .. }),
        "ExecStart must run `chime scheduler`: {argv:?}"
    );
    assert_eq!(cli.config, Some(PathBuf::from("/etc/chime/chime.toml")));
    // SIGHUP is the scheduler's reload (service::run); SIGTERM its graceful hand-over.
    assert_eq!(
        unit.value("Service", "ExecReload"),
        "/bin/kill -HUP $MAINPID"
    );
    assert_eq!(unit.value("Service", "KillSignal"), "SIGTERM");
    assert_eq!(
        unit.value("Service", "EnvironmentFile"),
        "/etc/chime/chime.env"
    );
    assert_eq!(unit.value("Service", "Restart"), "on-failure");
    assert_eq!(unit.value("Install", "WantedBy"), "multi-user.target");
}

#[test]
fn the_example_settings_and_environment_load_and_name_only_known_settings() {
    let env = env_file("systemd/chime.env");
    let known: Vec<String> = SETTINGS_KEYS
        .iter()
        .map(|key| format!("CHIME_{}", key.replace('.', "__").to_uppercase()))
        .collect();
    for (name, _) in &env {
        assert!(
            known.contains(name) || CLI_VARIABLES.contains(&name.as_str()),
            "deploy/systemd/chime.env sets {name}, which is no setting (known: {known:?})"
        );
    }
    // The certificate paths are checked for a readable PEM file: a test CA stands in for the
    // installed one.
    let ca = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tls/ca.pem");
    let env: Vec<(String, String)> = env
        .into_iter()
        .map(|(name, value)| (name, value.replace(INSTALLED_CA, ca)))
        .collect();
    let file = deploy_path("systemd/chime.toml");
    let settings = Settings::load_with_env(Some(&file), env.clone())
        .unwrap_or_else(|e| panic!("the example settings do not load:\n{e}"));
    let var = |name: &str| {
        env.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("chime.env sets no {name}"))
    };
    assert_eq!(settings.database_url, var("CHIME_DATABASE_URL"));
    assert_eq!(settings.amqp_url, var("CHIME_AMQP_URL"));
    assert_eq!(settings.bind.to_string(), "0.0.0.0:8080");
    assert_eq!(
        settings.jobs,
        [
            PathBuf::from("/etc/chime/jobs/*.toml"),
            PathBuf::from("/etc/chime/jobs/*.yaml")
        ]
    );
}

// ---- deploy/compose.yaml and deploy/docker/ ------------------------------------------------

/// The binaries the image installs (deploy/docker/Dockerfile), as its services run them.
const IMAGE_BINARIES: &[&str] = &["chime", "chime-runner", "example_worker", "sh"];

/// `node[key]` of a YAML mapping, with compose's `<<` merge keys applied (shallowly).
fn field<'a>(node: &'a Yaml, key: &str) -> Option<&'a Yaml> {
    let map = node.as_hash()?;
    map.get(&Yaml::String(key.to_owned())).or_else(|| {
        let merged = map.get(&Yaml::String("<<".to_owned()))?;
        field(merged, key)
    })
}

/// A YAML mapping's entries as strings (compose's `environment:`), merge keys applied.
fn string_map(node: &Yaml) -> Vec<(String, String)> {
    let Some(map) = node.as_hash() else {
        return Vec::new();
    };
    let mut entries = Vec::new();
    for (key, value) in map {
        match key.as_str() {
            Some("<<") => entries.extend(string_map(value)),
            Some(key) => {
                let value = match value {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    other => panic!("{key}: not a string: {other:?}"),
                };
                entries.retain(|(k, _)| k != key);
                entries.push((key.to_owned(), value));
            }
            None => panic!("a non-string key: {key:?}"),
        }
    }
    entries
}

fn strings(node: Option<&Yaml>) -> Vec<String> {
    node.and_then(Yaml::as_vec)
        .map(|items| {
            items
                .iter()
                .map(|i| i.as_str().expect("a string").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn compose() -> Yaml {
    let path = deploy_path("compose.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/compose.yaml");
    YamlLoader::load_from_str(&text)
        .expect("deploy/compose.yaml is YAML")
        .remove(0)
}

/// Where a path inside a chime container comes from: a volume of `service` or the image's
/// `COPY deploy/examples/ /etc/chime/jobs/`.
fn source_of(service: &Yaml, inside: &str) -> PathBuf {
    for volume in strings(field(service, "volumes")) {
        let mut parts = volume.split(':');
        let (Some(host), Some(target)) = (parts.next(), parts.next()) else {
            continue;
        };
        if target == inside {
            return deploy_path(host.trim_start_matches("./"));
        }
    }
    if let Some(name) = inside.strip_prefix("/etc/chime/jobs/") {
        return deploy_path("examples").join(name);
    }
    panic!("nothing in the container provides {inside}");
}

#[test]
fn the_compose_file_runs_commands_settings_files_and_ports_that_exist() {
    let compose = compose();
    let services = field(&compose, "services").expect("services");
    let services = services.as_hash().expect("a mapping");
    let name_of = |key: &Yaml| key.as_str().expect("a service name").to_owned();
    let names: Vec<String> = services.keys().map(name_of).collect();
    let mut schedulers = Vec::new();
    for (key, service) in services {
        let name = name_of(key);
        let image = field(service, "image")
            .and_then(Yaml::as_str)
            .expect("an image");
        assert!(image.contains(':'), "{name}: image {image} has no tag");
        // Every host file mounted exists.
        for volume in strings(field(service, "volumes")) {
            let host = volume.split(':').next().expect("host side");
            if let Some(relative) = host.strip_prefix("./") {
                assert!(
                    deploy_path(relative).exists(),
                    "{name} mounts {host}, which is not under deploy/"
                );
            }
        }
        for dependency in field(service, "depends_on")
            .and_then(Yaml::as_hash)
            .map(|d| d.keys().map(name_of).collect::<Vec<_>>())
            .unwrap_or_default()
        {
            assert!(
                names.contains(&dependency),
                "{name} depends on {dependency}"
            );
        }
        if image != "chime:local" {
            continue;
        }
        let command = strings(field(service, "command"));
        assert!(
            IMAGE_BINARIES.contains(&command[0].as_str()),
            "{name} runs {}, which the image does not have",
            command[0]
        );
        let env = field(service, "environment")
            .map(string_map)
            .unwrap_or_default();
        let known: Vec<String> = SETTINGS_KEYS
            .iter()
            .map(|key| format!("CHIME_{}", key.replace('.', "__").to_uppercase()))
            .collect();
        for (variable, _) in &env {
            assert!(
                known.contains(variable) || CLI_VARIABLES.contains(&variable.as_str()),
                "{name} sets {variable}, which is no setting"
            );
        }
        if command[0] != "chime" {
            continue;
        }
        let cli = Cli::try_parse_from(&command)
            .unwrap_or_else(|e| panic!("{name}: chime refuses {command:?}: {e}"));
        if !matches!(cli.command, Command::Scheduler { .. }) {
            continue;
        }
        let settings = Settings::load_with_env(None, env.clone())
            .unwrap_or_else(|e| panic!("{name}'s settings do not load:\n{e}"));
        // Its published port is the port it binds; its job files exist and load.
        let port = settings.bind.port();
        let ports = strings(field(service, "ports"));
        assert!(
            ports.iter().any(|p| p.ends_with(&format!(":{port}"))),
            "{name} binds {port} but publishes {ports:?}"
        );
        let jobs: Vec<PathBuf> = settings
            .jobs
            .iter()
            .map(|inside| source_of(service, inside.to_str().expect("utf-8")))
            .collect();
        chime_scheduler::config::load_job_files(&jobs)
            .unwrap_or_else(|e| panic!("{name}'s job files do not load:\n{e}"));
        schedulers.push((name, port));
    }
    assert!(
        schedulers.len() >= 2,
        "two schedulers, one to take over: {schedulers:?}"
    );

    // Prometheus scrapes every scheduler on its port, and RabbitMQ's exporter.
    let prometheus = std::fs::read_to_string(deploy_path("docker/prometheus.yml")).expect("read");
    let prometheus = YamlLoader::load_from_str(&prometheus)
        .expect("YAML")
        .remove(0);
    let targets: Vec<String> = field(&prometheus, "scrape_configs")
        .and_then(Yaml::as_vec)
        .expect("scrape_configs")
        .iter()
        .flat_map(|job| {
            field(job, "static_configs")
                .and_then(Yaml::as_vec)
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|config| strings(field(&config, "targets")))
        .collect();
    for (name, port) in &schedulers {
        assert!(
            targets.contains(&format!("{name}:{port}")),
            "{name} is not scraped: {targets:?}"
        );
    }
    for target in &targets {
        let host = target.split(':').next().expect("host");
        assert!(
            names.iter().any(|n| n == host),
            "Prometheus scrapes {target}: no such service"
        );
    }
    let plugins = std::fs::read_to_string(deploy_path("docker/enabled_plugins")).expect("read");
    assert!(
        targets.contains(&"rabbitmq:15692".to_owned()) && plugins.contains("rabbitmq_prometheus"),
        "RabbitMQ's exporter (port 15692) is enabled and scraped"
    );
    // Grafana's data source is the Prometheus service.
    let datasource =
        std::fs::read_to_string(deploy_path("docker/grafana/datasource.yaml")).expect("read");
    assert!(
        datasource.contains("url: http://prometheus:9090"),
        "{datasource}"
    );
}

#[test]
fn the_image_builds_the_binaries_the_services_run_and_runs_as_a_user() {
    let path = deploy_path("docker/Dockerfile");
    let dockerfile = std::fs::read_to_string(&path).expect("deploy/docker/Dockerfile");
    let manifests = ["scheduler/Cargo.toml", "runner/Cargo.toml"]
        .map(|m| std::fs::read_to_string(deploy_path("..").join(m)).expect("a manifest"));
    for bin in ["chime", "chime-runner"] {
        assert!(
            dockerfile.contains(&format!("--bin {bin} ")),
            "the image does not build {bin}"
        );
        assert!(
            manifests
                .iter()
                .any(|m| m.contains(&format!("name = \"{bin}\""))),
            "no crate has a binary {bin}"
        );
    }
    assert!(deploy_path("../worker-sdk/examples/example_worker.rs").exists());
    for line in dockerfile.lines().filter(|l| l.starts_with("COPY deploy/")) {
        let source = line.split_whitespace().nth(1).expect("a source");
        assert!(
            deploy_path("..").join(source).exists(),
            "{line}: no {source}"
        );
    }
    let user = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .next_back()
        .expect("a USER line");
    assert_ne!(user.trim(), "0", "the image runs as root");
    assert_ne!(user.trim(), "root", "the image runs as root");
    let cmd = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("CMD "))
        .expect("a CMD");
    let argv: Vec<String> = serde_json::from_str(cmd).expect("CMD in exec form");
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    assert!(matches!(cli.command, Command::Scheduler { .. }));
}

// ---- deploy/kubernetes/ --------------------------------------------------------------------

/// Every document of `deploy/kubernetes/<relative>`.
fn manifests(relative: &str) -> Vec<Yaml> {
    let path = deploy_path("kubernetes").join(relative);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The value at `path` (mapping keys; a number indexes a list).
fn at<'a>(node: &'a Yaml, path: &[&str]) -> &'a Yaml {
    let mut node = node;
    for key in path {
        node = match key.parse::<usize>() {
            Ok(i) => &node[i],
            Err(_) => &node[*key],
        };
    }
    node
}

fn text<'a>(node: &'a Yaml, path: &[&str]) -> &'a str {
    at(node, path)
        .as_str()
        .unwrap_or_else(|| panic!("{path:?} is not a string in {node:?}"))
}

#[test]
fn the_kubernetes_base_runs_schedulers_with_probes_a_disruption_budget_and_its_config() {
    let kustomization = manifests("base/kustomization.yaml").remove(0);
    let mut documents = Vec::new();
    for resource in strings(field(&kustomization, "resources")) {
        documents.extend(manifests(&format!("base/{resource}")));
    }
    // The generated ConfigMaps: their files exist; the job file loads. Which keep their name
    // (updated in place) and which get a hash suffix (a change rolls the pods).
    let mut config_maps: Vec<(String, Vec<String>)> = Vec::new();
    let mut in_place: Vec<String> = Vec::new();
    for generator in at(&kustomization, &["configMapGenerator"])
        .as_vec()
        .expect("configMapGenerator")
    {
        let files = strings(field(generator, "files"));
        for file in &files {
            assert!(
                deploy_path("kubernetes/base").join(file).exists(),
                "no {file}"
            );
        }
        let name = text(generator, &["name"]).to_owned();
        if at(generator, &["options", "disableNameSuffixHash"]).as_bool() == Some(true) {
            in_place.push(name.clone());
        }
        config_maps.push((name, files));
    }
    // The runner does not reload: its config must roll its pods.
    assert!(
        !in_place.iter().any(|name| name == "chime-runner"),
        "chime-runner's ConfigMap keeps its hash suffix"
    );
    let jobs = deploy_path("kubernetes/base/jobs.toml");
    chime_scheduler::config::load_job_files(&[jobs]).expect("the base's job file loads");
    let secret = manifests("base/secret.example.yaml").remove(0);
    let kind = |d: &Yaml| d["kind"].as_str().unwrap_or_default().to_owned();

    let scheduler = documents
        .iter()
        .find(|d| kind(d) == "Deployment" && text(d, &["metadata", "name"]) == "chime-scheduler")
        .expect("a chime-scheduler Deployment");
    let replicas = at(scheduler, &["spec", "replicas"])
        .as_i64()
        .expect("replicas");
    assert!(replicas >= 2, "one scheduler leads, another takes over");
    let pod = at(scheduler, &["spec", "template", "spec"]);
    assert!(at(pod, &["securityContext", "runAsNonRoot"]).as_bool() == Some(true));
    let container = at(pod, &["containers", "0"]);
    let args = strings(Some(at(container, &["args"])));
    let cli = Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    // --watch: an edit of the job ConfigMap, updated in place, is reloaded without a restart.
    assert!(
        matches!(cli.command, Command::Scheduler { watch: true, .. }),
        "the schedulers run `chime scheduler --watch`: {args:?}"
    );

    // Its environment: settings only, values from the Secret's keys or given here.
    let mut env = Vec::new();
    for variable in at(container, &["env"]).as_vec().expect("env") {
        let name = text(variable, &["name"]).to_owned();
        let known = SETTINGS_KEYS
            .iter()
            .any(|key| format!("CHIME_{}", key.replace('.', "__").to_uppercase()) == name);
        assert!(
            known || CLI_VARIABLES.contains(&name.as_str()),
            "{name} is no setting"
        );
        if let Some(key) = at(variable, &["valueFrom", "secretKeyRef", "key"]).as_str() {
            let value = text(&secret, &["stringData", key]);
            env.push((name, value.to_owned()));
        } else if let Some(value) = variable["value"].as_str() {
            env.push((name, value.to_owned()));
        } else {
            env.push((name, "pod-name".to_owned()));
        }
    }
    let settings = Settings::load_with_env(None, env)
        .unwrap_or_else(|e| panic!("the scheduler's settings do not load:\n{e}"));

    // Probes on the port it binds; the job file is in the mounted ConfigMap.
    let port = at(container, &["ports", "0"]);
    assert_eq!(
        port["containerPort"].as_i64(),
        Some(i64::from(settings.bind.port()))
    );
    let port_name = text(port, &["name"]);
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(text(container, &[probe, "httpGet", "path"]), path);
        assert_eq!(text(container, &[probe, "httpGet", "port"]), port_name);
    }
    assert!(
        !at(container, &["lifecycle", "preStop"]).is_badvalue(),
        "a preStop hook"
    );
    let mount = at(container, &["volumeMounts", "0"]);
    let volume = pod["volumes"]
        .as_vec()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    let config_map = text(volume, &["configMap", "name"]);
    assert!(
        in_place.iter().any(|name| name == config_map),
        "{config_map} is watched, so it is updated in place: disableNameSuffixHash: true"
    );
    assert!(
        mount["subPath"].is_badvalue(),
        "kubelet never updates a subPath mount: mount the directory"
    );
    let (_, files) = config_maps
        .iter()
        .find(|(name, _)| name == config_map)
        .expect("a generated ConfigMap");
    for job_file in &settings.jobs {
        let dir = job_file.parent().expect("a directory");
        let file = job_file
            .file_name()
            .expect("a file")
            .to_str()
            .expect("utf-8");
        assert_eq!(dir, PathBuf::from(text(mount, &["mountPath"])));
        assert!(
            files.iter().any(|f| f == file),
            "{file} is not in {config_map}"
        );
    }

    // A disruption budget that keeps a leader and a stand-by; a Service on the named port.
    let labels = at(scheduler, &["spec", "template", "metadata", "labels"]);
    let budget = documents
        .iter()
        .find(|d| kind(d) == "PodDisruptionBudget")
        .expect("a PodDisruptionBudget");
    assert_eq!(at(budget, &["spec", "selector", "matchLabels"]), labels);
    let min = at(budget, &["spec", "minAvailable"])
        .as_i64()
        .expect("minAvailable");
    assert!(
        (2..replicas).contains(&min) || replicas == 2 && min == 1,
        "{min} of {replicas}"
    );
    let service = documents
        .iter()
        .find(|d| kind(d) == "Service")
        .expect("a Service");
    assert_eq!(at(service, &["spec", "selector"]), labels);
    assert_eq!(
        text(service, &["spec", "ports", "0", "targetPort"]),
        port_name
    );
    let monitor = manifests("monitoring/servicemonitor.yaml").remove(0);
    assert_eq!(
        text(&monitor, &["spec", "endpoints", "0", "port"]),
        text(service, &["spec", "ports", "0", "name"])
    );
    assert_eq!(
        text(&monitor, &["spec", "endpoints", "0", "path"]),
        "/metrics"
    );
}
