/*
 * Proof of a shared token without sending it (HELLO, docs/protocol.md
 * section 4): both ends derive a key from the token and the namespace,
 * the client names its key by an id, each end sends a fresh nonce, and
 * each proves the key by an HMAC-SHA256 over both nonces, the namespace,
 * the server's node id and its advertised address.  The server proves
 * first; a client sends nothing else (no token, no payload) to a server
 * that cannot.
 *
 *   key    = HMAC(token, "ecstore-auth-v1 key" 0x00 ns)
 *   key_id = HMAC(key, "ecstore-auth-v1 id")[0..16)
 *   mac    = HMAC(key, LABEL 0x00 cnonce snonce u16 len|ns u16 len|node_id u16 len|addr)
 *            LABEL "ecstore-auth-v1 server" or "ecstore-auth-v1 client"
 *
 * Thread safety: pure functions.
 */
#ifndef ECS_AUTH_H
#define ECS_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define ECS_AUTH_KEY_SIZE 32   /* derived key */
#define ECS_AUTH_ID_SIZE 16    /* key id, sent in the clear */
#define ECS_AUTH_NONCE_SIZE 32 /* each side's nonce */
#define ECS_AUTH_MAC_SIZE 32   /* each side's proof */

/* The key token (len bytes) gives in namespace ns. */
void ecs__auth_key(const void *token, size_t len, const char *ns, uint8_t key[ECS_AUTH_KEY_SIZE]);

/* The id that names key on the wire. */
void ecs__auth_key_id(const uint8_t key[ECS_AUTH_KEY_SIZE], uint8_t id[ECS_AUTH_ID_SIZE]);

/* The proof of the server (server 1) or of the client (0) for one
 * handshake.  ns, node_id and addr are NUL-terminated (each at most
 * 65535 bytes; longer ones are cut there, which no caller reaches). */
void ecs__auth_mac(const uint8_t key[ECS_AUTH_KEY_SIZE], int server,
                   const uint8_t cnonce[ECS_AUTH_NONCE_SIZE], const uint8_t snonce[ECS_AUTH_NONCE_SIZE],
                   const char *ns, const char *node_id, const char *addr, uint8_t mac[ECS_AUTH_MAC_SIZE]);

/* n random bytes from the kernel (getrandom); 0 or -1. */
int ecs__auth_random(void *p, size_t n);

/* Overwrites n bytes in a way the compiler keeps. */
void ecs__auth_wipe(void *p, size_t n);

#endif
