/*
 * The token proof of HELLO (see auth.h).
 */
#include "store/core/auth.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <sys/types.h>

#include "store/core/sha256.h"

void ecs__auth_wipe(void *p, size_t n) {
  volatile uint8_t *v = p;
  while (n--)
    *v++ = 0;
}

void ecs__auth_key(const void *token, size_t len, const char *ns, uint8_t key[ECS_AUTH_KEY_SIZE]) {
  static const char label[] = "ecstore-auth-v1 key"; /* its NUL separates it from ns */
  uint8_t msg[sizeof label + 256];
  size_t nl = strnlen(ns, 256);
  memcpy(msg, label, sizeof label);
  memcpy(msg + sizeof label, ns, nl);
  ecs__hmac_sha256(token, len, msg, sizeof label + nl, key);
  ecs__auth_wipe(msg, sizeof msg);
}

void ecs__auth_key_id(const uint8_t key[ECS_AUTH_KEY_SIZE], uint8_t id[ECS_AUTH_ID_SIZE]) {
  static const char label[] = "ecstore-auth-v1 id";
  uint8_t full[ECS_SHA256_SIZE];
  ecs__hmac_sha256(key, ECS_AUTH_KEY_SIZE, label, sizeof label - 1, full);
  memcpy(id, full, ECS_AUTH_ID_SIZE);
}

void ecs__auth_mac(const uint8_t key[ECS_AUTH_KEY_SIZE], int server,
                   const uint8_t cnonce[ECS_AUTH_NONCE_SIZE], const uint8_t snonce[ECS_AUTH_NONCE_SIZE],
                   const char *ns, const char *node_id, const char *addr, uint8_t mac[ECS_AUTH_MAC_SIZE]) {
  const char *label = server ? "ecstore-auth-v1 server" : "ecstore-auth-v1 client";
  ecs_sha256_t in, out;
  uint8_t pad[ECS_SHA256_BLOCK], inner[ECS_SHA256_SIZE];
  /* HMAC by hand, so the variable-length parts need no buffer */
  memset(pad, 0x36, sizeof pad);
  for (size_t i = 0; i < ECS_AUTH_KEY_SIZE; i++)
    pad[i] ^= key[i];
  ecs__sha256_init(&in);
  ecs__sha256_update(&in, pad, sizeof pad);
  ecs__sha256_update(&in, label, strlen(label) + 1);
  ecs__sha256_update(&in, cnonce, ECS_AUTH_NONCE_SIZE);
  ecs__sha256_update(&in, snonce, ECS_AUTH_NONCE_SIZE);
  const char *parts[3] = {ns, node_id, addr};
  for (int i = 0; i < 3; i++) {
    uint8_t hdr[2];
    size_t n = strnlen(parts[i], 65535);
    hdr[0] = (uint8_t)(n & 0xff);
    hdr[1] = (uint8_t)(n >> 8);
    ecs__sha256_update(&in, hdr, 2);
    ecs__sha256_update(&in, parts[i], n);
  }
  ecs__sha256_final(&in, inner);
  memset(pad, 0x5c, sizeof pad);
  for (size_t i = 0; i < ECS_AUTH_KEY_SIZE; i++)
    pad[i] ^= key[i];
  ecs__sha256_init(&out);
  ecs__sha256_update(&out, pad, sizeof pad);
  ecs__sha256_update(&out, inner, sizeof inner);
  ecs__sha256_final(&out, mac);
  ecs__auth_wipe(pad, sizeof pad);
  ecs__auth_wipe(&in, sizeof in);
  ecs__auth_wipe(&out, sizeof out);
}

int ecs__auth_random(void *p, size_t n) {
  uint8_t *b = p;
  while (n) {
    ssize_t k = getrandom(b, n, 0);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return -1;
    b += k;
    n -= (size_t)k;
  }
  return 0;
}
