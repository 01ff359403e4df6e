#!/usr/bin/env bash
# Runs the Helm chart's NOTES commands (rendered by validate-helm.sh into NOTES_FILE for a
# release in NAMESPACE) against a real TLS cluster of this build's binaries on loopback, as far
# as a machine without Kubernetes allows: the servers present a certificate for the chart's
# service names; `kubectl` is a stand-in that answers `get secret` from local files and refuses
# any call without `-n NAMESPACE`; the `kubectl port-forward` lines (checked for the namespace)
# become local listeners on free ports; the dataset is a small synthetic one and the job a micro
# spec. Everything else is run as written, by bash and, where it is installed, by zsh: the
# secret reads, every `export`, the COORDINATOR/ACCOUNTANT arrays, the dpctl budget, submit,
# list and budget show commands, and grpcurl (from scripts/tools.sh).
# Usage: scripts/notes-check.sh NOTES_FILE BIN_DIR NAMESPACE   (BIN_DIR holds e2e-dpcap-accountant, …)
set -euo pipefail
notes=$(realpath "$1")
bin=$(realpath "$2")
namespace=$3
grpcurl=$(scripts/tools.sh grpcurl)
for b in e2e-dpcap-accountant e2e-dpcap-coordinator e2e-dpctl; do
  [ -x "$bin/$b" ] || { echo "notes-check: $bin/$b is missing: run the README's test command first" >&2; exit 1; }
done
command -v openssl > /dev/null || { echo "notes-check: openssl is needed to make the cluster's certificates" >&2; exit 1; }
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2> /dev/null || true; done
  wait 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work"
mkdir bin
ln -s "$bin/e2e-dpctl" bin/dpctl
ln -s "$grpcurl" bin/grpcurl
# kubectl -n NAMESPACE get secret NAME -o jsonpath={.data.KEY}: secrets/NAME/KEY, base64.
cat > bin/kubectl <<KUBECTL
#!/usr/bin/env bash
[ "\$1" = -n ] && [ "\$2" = "$namespace" ] || { echo "kubectl: not in namespace $namespace (-n $namespace): \$*" >&2; exit 1; }
[ "\$3 \$4 \$6" = "get secret -o" ] || { echo "kubectl stand-in: only get secret NAME -o jsonpath=...: \$*" >&2; exit 1; }
key=\${7#jsonpath=\{.data.}; key=\${key%\}}; key=\${key//\\\\./.}
base64 < "$work/secrets/\$5/\$key"
KUBECTL
chmod +x bin/kubectl
export PATH="$work/bin:$PATH"
kubectl_lines=$(sed -n 's/^  *//p' "$notes" | grep '^kubectl ' || true)
[ -n "$kubectl_lines" ] || { echo "notes-check: the NOTES have no kubectl lines" >&2; exit 1; }
if grep -v -- "^kubectl -n $namespace " <<< "$kubectl_lines"; then
  echo "notes-check: the kubectl lines above lack -n $namespace" >&2; exit 1
fi
# The chart's names, as its certificate must carry them.
coordinator=$(grep -o 'tls-domain [a-z0-9-]*coordinator' "$notes" | head -1 | cut -d' ' -f2)
accountant=$(grep -o 'tls-domain [a-z0-9-]*accountant' "$notes" | head -1 | cut -d' ' -f2)
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=notes CA" \
  -keyout ca.key -out ca.crt 2> /dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=dpcap" -keyout tls.key -out tls.csr 2> /dev/null
printf 'subjectAltName=DNS:%s,DNS:%s\nextendedKeyUsage=serverAuth\n' "$coordinator" "$accountant" > san.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out tls.crt 2> /dev/null
echo "k1 $(openssl rand -hex 32)" > capability.keys
for role in operator viewer worker coordinator privacy-admin; do echo "$role $(openssl rand -hex 24)"; done > tokens
tok() { awk -v r="$1" '$1 == r {print $2}' tokens; }
# The chart's Secrets as the stand-in kubectl reads them: every secret the NOTES name.
for name in $(grep -o 'get secret [a-z0-9.-]*' "$notes" | cut -d' ' -f3 | sort -u); do
  mkdir -p "secrets/$name"
  cp ca.crt "secrets/$name/ca.crt"
  for role in operator viewer worker coordinator privacy-admin; do tok "$role" | tr -d '\n' > "secrets/$name/$role-token"; done
done
free() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
acc_port=$(free)
coord_port=$(free)
tls=(--tls-cert tls.crt --tls-key tls.key --auth-tokens-file tokens --capability-key-file capability.keys)
"$bin/e2e-dpcap-accountant" --listen "127.0.0.1:$acc_port" --metrics-listen 127.0.0.1:0 --ledger ./ledger "${tls[@]}" \
  2> accountant.log &
pids+=($!)
"$bin/e2e-dpcap-coordinator" --listen "127.0.0.1:$coord_port" --metrics-listen 127.0.0.1:0 --store ./store "${tls[@]}" \
  --accountant "https://127.0.0.1:$acc_port" --tls-ca ca.crt --tls-domain "$accountant" \
  --accountant-token "$(tok coordinator)" 2> coordinator.log &
pids+=($!)
dpctl dataset synth --out ./data --examples 200 --eval-examples 0 > /dev/null
dpctl dataset index --train-tokenizer ./data/train > /dev/null
printf 'name: notes\ndataset: %s/data/train\nmodel: micro\nepsilon: 8\ndelta: 0.001\nbatch_size: 20\nsteps: 2\n' "$work" > job.yaml
# The NOTES' lines, with the port-forwards' ports and the local stand-ins.
sed -n 's/^  *//p' "$notes" | grep -E '^(export |COORDINATOR=|ACCOUNTANT=|DPCAP_TOKEN=|dpctl |grpcurl |token\(\) |kubectl .* get secret )' \
  | grep -v ' watch ' \
  | sed -e "s#127.0.0.1:7071#127.0.0.1:$coord_port#g" -e "s#127.0.0.1:7070#127.0.0.1:$acc_port#g" \
    -e "s#s3://BUCKET/DATASET#$work/data/train#" \
    -e "s#deploy/jobs/dpcap-base-laion.yaml#$work/job.yaml#" -e 's#--delta 4e-9#--delta 1e-3#' > commands.sh
for _ in $(seq 100); do
  (exec 3<> "/dev/tcp/127.0.0.1/$coord_port") 2> /dev/null && (exec 3<> "/dev/tcp/127.0.0.1/$acc_port") 2> /dev/null && break
  sleep 0.1
done
shells=(bash)
if command -v zsh > /dev/null; then shells+=(zsh); else echo "notes-check: zsh is not installed; bash only"; fi
for shell in "${shells[@]}"; do
  if ! "$shell" -e -x -c 'source ./commands.sh' > "out-$shell.txt" 2>&1; then
    echo "notes-check: the NOTES commands failed under $shell against a cluster of the rendered names:" >&2
    cat "out-$shell.txt" accountant.log coordinator.log >&2
    exit 1
  fi
  grep -q '"epsilon_budget":8' "out-$shell.txt" && grep -q '^JOB ' "out-$shell.txt" && grep -q 'notes' "out-$shell.txt" \
    && grep -q '"jobs"' "out-$shell.txt" \
    || { echo "notes-check: under $shell the NOTES commands ran but did not set the budget, submit, list and grpcurl:" >&2; cat "out-$shell.txt" >&2; exit 1; }
done
echo "notes-check: the NOTES commands (secrets, budget, submit, list, budget show, grpcurl) work under ${shells[*]} against a TLS cluster named as the chart names it, in namespace $namespace"
