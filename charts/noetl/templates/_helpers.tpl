{{- define "noetl.env" -}}
- name: NOETL_NATS_URL
  value: {{ .Values.nats.url | quote }}
- name: NOETL_PREFIX
  value: {{ .Values.prefix | quote }}
{{- with .Values.objectStore }}
{{- if .url }}
- name: NOETL_OBJECT_STORE
  value: {{ .url | quote }}
{{- end }}
{{- if .endpoint }}
- name: NOETL_S3_ENDPOINT
  value: {{ .endpoint | quote }}
{{- end }}
{{- if .region }}
- name: AWS_REGION
  value: {{ .region | quote }}
{{- end }}
{{- if .credentialsSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .credentialsSecret }}
      key: access-key-id
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .credentialsSecret }}
      key: secret-access-key
{{- end }}
{{- end }}
{{- if .Values.secretKeyRef.name }}
- name: NOETL_SECRET_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.secretKeyRef.name }}
      key: {{ .Values.secretKeyRef.key }}
{{- end }}
{{- end -}}
