{{- define "noetl.env" -}}
- name: NOETL_NATS_URL
  value: {{ .Values.nats.url | quote }}
- name: NOETL_PREFIX
  value: {{ .Values.prefix | quote }}
{{- if .Values.objectStoreUrl }}
- name: NOETL_OBJECT_STORE_URL
  value: {{ .Values.objectStoreUrl | quote }}
{{- end }}
{{- if .Values.secretKeyRef.name }}
- name: NOETL_SECRET_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.secretKeyRef.name }}
      key: {{ .Values.secretKeyRef.key }}
{{- end }}
{{- end -}}
