#!/bin/sh
# A DEVELOPMENT certificate authority and one server certificate for `glasu serve`.
# Not for production: use your organisation's CA (or cert-manager) there.
#
# usage: deploy/dev-ca.sh OUT_DIR SAN [SAN ...]
#   SAN is a subjectAltName entry: DNS:name or IP:address, e.g.
#   deploy/dev-ca.sh deploy/secrets DNS:service DNS:localhost IP:127.0.0.1
#
# Writes (the CA is reused when OUT_DIR already holds one):
#   ca.crt      the CA certificate: give it to every worker (--ca-file / GLASU_CA_FILE)
#   ca.key      the CA private key: keep it away from everything else (mode 0600)
#   server.crt  the service's certificate (GLASU_TLS_CERTFILE)
#   server.key  its private key (GLASU_TLS_KEYFILE, mode 0600)
set -eu

if [ "$#" -lt 2 ]; then
    sed -n '2,13p' "$0" >&2
    exit 2
fi
out=$1
shift
first_name=${1#*:}
sans=""
for san in "$@"; do
    case "$san" in
        DNS:?* | IP:?*) ;;
        *)
            echo "dev-ca.sh: '$san' is not DNS:name or IP:address" >&2
            exit 2
            ;;
    esac
    sans="${sans:+$sans,}$san"
done

umask 077
mkdir -p "$out"
if [ ! -f "$out/ca.key" ] || [ ! -f "$out/ca.crt" ]; then
    openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -sha256 \
        -days 825 -subj "/CN=glasu development CA" \
        -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/server.ext" <<EOF
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = $sans
EOF
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -sha256 \
    -subj "/CN=$first_name" -keyout "$out/server.key" -out "$work/server.csr" 2>/dev/null
openssl x509 -req -sha256 -days 365 -in "$work/server.csr" \
    -CA "$out/ca.crt" -CAkey "$out/ca.key" -set_serial "0x$(openssl rand -hex 16)" \
    -extfile "$work/server.ext" -out "$out/server.crt" 2>/dev/null
chmod 0644 "$out/ca.crt" "$out/server.crt"
openssl verify -CAfile "$out/ca.crt" "$out/server.crt" >/dev/null
echo "dev CA: $out/ca.crt; server certificate for $sans: $out/server.crt (key $out/server.key)"
