package replication

import (
	"errors"
	"fmt"
	"strings"
)

// TLS is how a replica connects to its primary over TLS: the options of
// CHANGE MASTER TO ... MASTER_SSL=1. The files are read by the replica's
// mariadbd, so their paths are as that server's host sees them, which need
// not be the controller's.
type TLS struct {
	// CAFile holds the PEM certificates of the CAs that sign the
	// primaries' certificates (MASTER_SSL_CA). Required: without a CA the
	// replica would take any certificate.
	CAFile string `json:"ca_file"`
	// CertFile and KeyFile are the replica's own certificate and key
	// (MASTER_SSL_CERT, MASTER_SSL_KEY), for a replication account
	// created REQUIRE X509 or the like. Default none.
	CertFile string `json:"cert_file,omitempty"`
	KeyFile  string `json:"key_file,omitempty"`
	// VerifyServerCert checks that the primary's certificate names the
	// host the replica dials (MASTER_SSL_VERIFY_SERVER_CERT), on top of
	// the chain to CAFile, which is always checked. Default true; false
	// for primaries reached by a name their certificate lacks.
	VerifyServerCert *bool `json:"verify_server_cert,omitempty"`
}

// verifyName reports whether the primary's certificate must name the
// host dialed.
func (t *TLS) verifyName() bool { return t.VerifyServerCert == nil || *t.VerifyServerCert }

// Validate rejects a TLS without a CA, a certificate without its key and
// paths that cannot be quoted the same way under every sql_mode, so that
// a config fails when it is read rather than at the first failover.
func (t *TLS) Validate() error {
	switch {
	case t.CAFile == "":
		return errors.New("replication: tls: ca_file is required")
	case (t.CertFile == "") != (t.KeyFile == ""):
		return errors.New("replication: tls: cert_file and key_file go together")
	}
	for _, p := range []string{t.CAFile, t.CertFile, t.KeyFile} {
		if !plain(p) || len(p) > 511 {
			return fmt.Errorf("replication: tls: path %q: want at most 511 characters without backslashes or control characters", p)
		}
	}
	return nil
}

// changeOptions are the CHANGE MASTER TO options that make the replica
// connect over TLS as t says; none for nil t, which leaves whatever the
// replica had (a fresh or reset replica: plain TCP).
func (t *TLS) changeOptions() string {
	if t == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString(", MASTER_SSL = 1, MASTER_SSL_CA = " + quote(t.CAFile))
	b.WriteString(", MASTER_SSL_CERT = " + quote(t.CertFile) + ", MASTER_SSL_KEY = " + quote(t.KeyFile))
	if t.verifyName() {
		b.WriteString(", MASTER_SSL_VERIFY_SERVER_CERT = 1")
	} else {
		b.WriteString(", MASTER_SSL_VERIFY_SERVER_CERT = 0")
	}
	return b.String()
}
