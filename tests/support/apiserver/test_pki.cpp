#include "tests/support/apiserver/test_pki.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <stdexcept>

namespace tandem::testing {
namespace {

struct KeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct CertDeleter {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;
using CertPtr = std::unique_ptr<X509, CertDeleter>;
using BioPtr = std::unique_ptr<BIO, BioDeleter>;

void check(bool ok, const char* what) {
  if (!ok) {
    char detail[256] = {0};
    ERR_error_string_n(ERR_get_error(), detail, sizeof(detail));
    throw std::runtime_error(std::string("test PKI: ") + what + " failed: " + detail);
  }
}

KeyPtr newKey() {
  KeyPtr key(EVP_EC_gen("P-256"));
  check(key != nullptr, "EC key generation");
  return key;
}

void addExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  check(extension != nullptr, "certificate extension");
  check(X509_add_ext(cert, extension, -1) == 1, "adding an extension");
  X509_EXTENSION_free(extension);
}

// A certificate for `key` named `common_name`, signed by `issuer_key`
// (self-signed when `issuer` is null).
CertPtr makeCertificate(EVP_PKEY* key, const std::string& common_name, X509* issuer,
                        EVP_PKEY* issuer_key, bool is_ca, const char* extended_usage,
                        const char* subject_alt_names) {
  CertPtr cert(X509_new());
  check(cert != nullptr, "X509_new");
  X509_set_version(cert.get(), 2);
  unsigned char serial_bytes[16];
  check(RAND_bytes(serial_bytes, sizeof(serial_bytes)) == 1, "serial number");
  serial_bytes[0] &= 0x7f;
  BIGNUM* serial = BN_bin2bn(serial_bytes, sizeof(serial_bytes), nullptr);
  BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(cert.get()));
  BN_free(serial);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * 3600);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1,
                             0);
  X509* issuer_cert = issuer != nullptr ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(issuer_cert));
  if (is_ca) {
    addExtension(cert.get(), issuer_cert, NID_basic_constraints, "critical,CA:TRUE");
    addExtension(cert.get(), issuer_cert, NID_key_usage, "critical,keyCertSign,cRLSign");
    addExtension(cert.get(), issuer_cert, NID_subject_key_identifier, "hash");
  } else {
    addExtension(cert.get(), issuer_cert, NID_basic_constraints, "critical,CA:FALSE");
    addExtension(cert.get(), issuer_cert, NID_key_usage, "critical,digitalSignature");
    addExtension(cert.get(), issuer_cert, NID_ext_key_usage, extended_usage);
    addExtension(cert.get(), issuer_cert, NID_authority_key_identifier, "keyid:always");
  }
  if (subject_alt_names != nullptr) {
    addExtension(cert.get(), issuer_cert, NID_subject_alt_name, subject_alt_names);
  }
  check(X509_sign(cert.get(), issuer_key, EVP_sha256()) > 0, "signing a certificate");
  return cert;
}

std::string bioText(BIO* bio) {
  char* data = nullptr;
  long size = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(size));
}

std::string certificatePem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  check(PEM_write_bio_X509(bio.get(), cert) == 1, "writing a certificate");
  return bioText(bio.get());
}

std::string keyPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  check(PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) == 1,
        "writing a key");
  return bioText(bio.get());
}

}  // namespace

TestPki generateTestPki(const std::vector<std::string>& extra_ips) {
  std::string names = "IP:127.0.0.1,DNS:localhost";
  for (const std::string& ip : extra_ips) names += ",IP:" + ip;
  KeyPtr ca_key = newKey();
  CertPtr ca = makeCertificate(ca_key.get(), "tandem-test-ca", nullptr, ca_key.get(), true, nullptr,
                               nullptr);
  KeyPtr server_key = newKey();
  CertPtr server = makeCertificate(server_key.get(), "tandem-test-apiserver", ca.get(),
                                   ca_key.get(), false, "serverAuth", names.c_str());
  KeyPtr client_key = newKey();
  CertPtr client = makeCertificate(client_key.get(), "test-client", ca.get(), ca_key.get(), false,
                                   "clientAuth", nullptr);
  TestPki pki;
  pki.ca_certificate = certificatePem(ca.get());
  pki.server_certificate = certificatePem(server.get());
  pki.server_key = keyPem(server_key.get());
  pki.client_certificate = certificatePem(client.get());
  pki.client_key = keyPem(client_key.get());
  return pki;
}

std::string certificateCommonName(const std::string& certificate_pem) {
  BioPtr bio(BIO_new_mem_buf(certificate_pem.data(), static_cast<int>(certificate_pem.size())));
  CertPtr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) return "";
  char name[256] = {0};
  int length =
      X509_NAME_get_text_by_NID(X509_get_subject_name(cert.get()), NID_commonName, name, 256);
  return length > 0 ? std::string(name, static_cast<size_t>(length)) : "";
}

}  // namespace tandem::testing
