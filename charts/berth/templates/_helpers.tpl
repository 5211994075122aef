{{/*
Helm's own labels, on every object the chart templates. The objects themselves
(names, selectors, the app.kubernetes.io/name label where manifests/ has it) are
those of manifests/, so that both install the same thing.
*/}}
{{- define "berth.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The ServiceAccount berth runs as, as the apiserver names it. */}}
{{- define "berth.user" -}}
system:serviceaccount:{{ .Release.Namespace }}:berth
{{- end }}

{{/*
The namespaces never sent to berth, as a JSON list: excludedNamespaces, then the
release namespace (berth's own pods must never wait for berth).
*/}}
{{- define "berth.excludedNamespaces" -}}
{{- concat .Values.excludedNamespaces (list .Release.Namespace) | uniq | toJson }}
{{- end }}

{{/* A namespaceSelector that leaves out the namespaces in the list given. */}}
{{- define "berth.namespaceSelector" -}}
matchExpressions:
- key: kubernetes.io/metadata.name
  operator: NotIn
  values: {{ toJson . }}
{{- end }}

{{/*
A webhook's clientConfig for the path given: the Service berth, or with webhook.url
set (development: berth outside the cluster) that URL. With certificates from a
Secret, the caBundle given; cert-manager's cainjector fills it otherwise.
*/}}
{{- define "berth.clientConfig" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- with $root.Values.webhook.url -}}
url: {{ printf "%s%s" (trimSuffix "/" .) $path | quote }}
{{- else -}}
service: {name: berth, namespace: {{ $root.Release.Namespace }}, path: {{ $path }}, port: 443}
{{- end }}
{{- if and (eq $root.Values.certificates.source "secret") $root.Values.certificates.caBundle }}
caBundle: {{ $root.Values.certificates.caBundle | trim | quote }}
{{- end }}
{{- end }}

{{/* The annotations of both webhook configurations, if any. */}}
{{- define "berth.webhookAnnotations" -}}
{{- if eq .Values.certificates.source "cert-manager" -}}
annotations:
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/berth
{{- end }}
{{- end }}

{{/* Fails on a certificates.source the chart does not know. */}}
{{- define "berth.checkValues" -}}
{{- if not (has .Values.certificates.source (list "secret" "cert-manager")) }}
{{- fail (printf "certificates.source must be secret or cert-manager, not %q" .Values.certificates.source) }}
{{- end }}
{{- $timeout := int .Values.webhook.timeoutSeconds }}
{{- if or (lt $timeout 1) (gt $timeout 30) }}
{{- fail (printf "webhook.timeoutSeconds must be 1 to 30 (the apiserver's bounds), not %v" .Values.webhook.timeoutSeconds) }}
{{- end }}
{{- if and (not .Values.clientAuth.enabled) (not .Values.apiserverCIDRs) (not (and .Values.networkPolicy.enabled .Values.networkPolicy.apiserverPeers)) }}
{{- fail "with clientAuth.enabled=false, set apiserverCIDRs or networkPolicy.apiserverPeers: without the apiserver's client certificate, its addresses are the only lock on berth's webhook port (docs/operator-guide.md, \"Closing the webhook's door\")" }}
{{- end }}
{{- with .Values.webhook.url }}
{{- if not (hasPrefix "https://" .) }}
{{- fail (printf "webhook.url must start with https:// (the apiserver calls webhooks over TLS only), not %q" .) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Annotations from values, each value a string (Kubernetes takes nothing else, and
`--set a=true` would give a boolean).
*/}}
{{- define "berth.annotations" -}}
{{- range $key, $value := . }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end }}
