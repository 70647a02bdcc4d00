/*
 * Backend "disk": one file per object in a directory, as vLLM's example
 * disk connector does, plus what it lacks: a write goes to a temp file in
 * the same directory and is renamed over the final name (atomic, so a
 * reader sees the whole old object, the whole new one, or none), and a
 * 128-byte header (backend.h) lets a load check the shape, the size and
 * the checksum.  A missing file is a miss; a short, corrupt or foreign file
 * is ECS_ECHECKSUM (a miss too).  Nothing is ever evicted: the directory
 * is the operator's to clean.
 *
 * File names: a key made only of [A-Za-z0-9_-] (an mm_hash is hex) is used
 * as is; any other key becomes '%' + its hex, which no plain name starts
 * with, so the mapping is one-to-one.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ec_connector/backend.h"
#include "store/core/net.h"

#define DISK_SUFFIX ".ect"

typedef struct disk_h {
  char dir[512];     /* the directory */
  int fsync;         /* fsync before rename */
  int verify;        /* check the checksum on load */
  unsigned long seq; /* temp-file counter */
  char err[320];     /* last whole-batch error */
} disk_h_t;

static int disk_name(const disk_h_t *h, const ecs_key_t *k, char *out, size_t cap) {
  const unsigned char *s = k->data;
  int plain = k->len <= 200;
  for (size_t i = 0; plain && i < k->len; i++)
    plain = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
            s[i] == '_' || s[i] == '-';
  int n = snprintf(out, cap, "%s/", h->dir);
  if (n < 0 || (size_t)n >= cap)
    return ECS_EKEY;
  size_t off = (size_t)n;
  if (plain) {
    if (off + k->len + sizeof DISK_SUFFIX > cap)
      return ECS_EKEY;
    memcpy(out + off, s, k->len);
    off += k->len;
  } else {
    if (off + 1 + 2 * k->len + sizeof DISK_SUFFIX > cap)
      return ECS_EKEY;
    out[off++] = '%';
    for (size_t i = 0; i < k->len; i++) {
      static const char hx[] = "0123456789abcdef";
      out[off++] = hx[s[i] >> 4];
      out[off++] = hx[s[i] & 15];
    }
  }
  memcpy(out + off, DISK_SUFFIX, sizeof DISK_SUFFIX);
  return ECS_OK;
}

static int disk_open(const ecs_ec_config_t *cfg, int kind, void **out, char *err, size_t errlen) {
  (void)kind;
  if (mkdir(cfg->disk_path, 0755) != 0 && errno != EEXIST) {
    int e = errno;
    snprintf(err, errlen, "key \"disk_path\": mkdir %s: %s", cfg->disk_path, strerror(e));
    return ecs_from_errno(e);
  }
  struct stat st;
  if (stat(cfg->disk_path, &st) != 0 || !S_ISDIR(st.st_mode) || access(cfg->disk_path, W_OK | X_OK) != 0) {
    snprintf(err, errlen, "key \"disk_path\": %s is not a writable directory", cfg->disk_path);
    return ECS_EINVAL;
  }
  disk_h_t *h = calloc(1, sizeof *h);
  if (h == NULL)
    return ECS_ENOMEM;
  snprintf(h->dir, sizeof h->dir, "%s", cfg->disk_path);
  h->fsync = cfg->disk_fsync;
  h->verify = cfg->verify_checksum;
  *out = h;
  return ECS_OK;
}

static void disk_close(void *h) {
  free(h);
}

static int write_all(int fd, struct iovec *iov, int cnt) {
  while (cnt > 0) {
    ssize_t w = writev(fd, iov, cnt);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return ecs_from_errno(errno);
    }
    ecs_iov_advance(&iov, &cnt, (size_t)w);
  }
  return ECS_OK;
}

static int disk_put1(disk_h_t *h, const ecs_key_t *k, const ecs_tensor_t *t) {
  char path[1024], tmp[1100];
  int rc = ecs_key_check(k->data, k->len);
  if (rc == ECS_OK)
    rc = disk_name(h, k, path, sizeof path);
  if (rc == ECS_OK)
    rc = ecs__ec_tensor_check(t);
  if (rc != ECS_OK)
    return rc;
  uint8_t hdr[ECS__EC_HDR_SIZE];
  ecs__ec_hdr_encode(hdr, &t->desc, t->nbytes, ecs_checksum(t->data, t->nbytes));
  snprintf(tmp, sizeof tmp, "%s.tmp.%d.%lu.%lx", path, (int)getpid(), ++h->seq,
           (unsigned long)pthread_self());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    int e = errno;
    snprintf(h->err, sizeof h->err, "create %.250s: %s", tmp, strerror(e));
    return e == ENOSPC ? ECS_ENOSPC : ECS_EIO;
  }
  struct iovec iov[2] = {{hdr, sizeof hdr}, {(void *)t->data, (size_t)t->nbytes}};
  rc = write_all(fd, iov, t->nbytes ? 2 : 1);
  if (rc == ECS_OK && h->fsync && fsync(fd) != 0)
    rc = ecs_from_errno(errno);
  if (close(fd) != 0 && rc == ECS_OK)
    rc = ecs_from_errno(errno);
  if (rc == ECS_OK && rename(tmp, path) != 0)
    rc = ecs_from_errno(errno);
  if (rc != ECS_OK) {
    snprintf(h->err, sizeof h->err, "write %.250s: %s", path, ecs_strerror(rc));
    unlink(tmp);
    return rc == ECS_ENOSPC ? rc : ECS_EIO;
  }
  return ECS_OK;
}

static int disk_put(void *hp, const ecs_key_t *keys, const ecs_tensor_t *t, size_t n, int *status) {
  for (size_t i = 0; i < n; i++)
    status[i] = disk_put1(hp, &keys[i], &t[i]);
  return ECS_OK;
}

static int read_full(int fd, void *buf, size_t n) {
  uint8_t *p = buf;
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return ECS_EIO;
    }
    if (r == 0)
      return ECS_ECHECKSUM; /* truncated */
    p += r;
    n -= (size_t)r;
  }
  return ECS_OK;
}

static void disk_get1(disk_h_t *h, const ecs_key_t *k, ecs_get_buf_t *b) {
  char path[1024];
  b->nbytes = 0;
  b->status = ecs_key_check(k->data, k->len);
  if (b->status == ECS_OK)
    b->status = disk_name(h, k, path, sizeof path);
  if (b->status != ECS_OK)
    return;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    b->status = errno == ENOENT ? ECS_ENOTFOUND : ECS_EIO;
    return;
  }
  uint8_t hdr[ECS__EC_HDR_SIZE];
  uint64_t nbytes = 0, sum = 0;
  struct stat st;
  int rc = read_full(fd, hdr, sizeof hdr);
  if (rc == ECS_OK)
    rc = ecs__ec_hdr_decode(hdr, &b->desc, &nbytes, &sum);
  if (rc == ECS_OK && (fstat(fd, &st) != 0 || (uint64_t)st.st_size != ECS__EC_HDR_SIZE + nbytes))
    rc = ECS_ECHECKSUM; /* truncated or trailing junk */
  if (rc == ECS_OK && nbytes > b->capacity) {
    b->nbytes = nbytes;
    rc = ECS_EBUFSMALL;
  }
  if (rc == ECS_OK)
    rc = read_full(fd, b->data, (size_t)nbytes);
  if (rc == ECS_OK && h->verify && ecs_checksum(b->data, (size_t)nbytes) != sum)
    rc = ECS_ECHECKSUM;
  close(fd);
  if (rc == ECS_OK)
    b->nbytes = nbytes;
  b->status = rc;
}

static int disk_get(void *hp, const ecs_key_t *keys, ecs_get_buf_t *bufs, size_t n) {
  for (size_t i = 0; i < n; i++)
    disk_get1(hp, &keys[i], &bufs[i]);
  return ECS_OK;
}

static int disk_exists(void *hp, const ecs_key_t *keys, size_t n, int *out) {
  char path[1024];
  for (size_t i = 0; i < n; i++) {
    out[i] = 0;
    if (ecs_key_check(keys[i].data, keys[i].len) == ECS_OK &&
        disk_name(hp, &keys[i], path, sizeof path) == ECS_OK)
      out[i] = access(path, F_OK) == 0;
  }
  return ECS_OK;
}

static int disk_remove(void *hp, const ecs_key_t *keys, size_t n, int *status) {
  char path[1024];
  for (size_t i = 0; i < n; i++) {
    status[i] = ecs_key_check(keys[i].data, keys[i].len);
    if (status[i] == ECS_OK)
      status[i] = disk_name(hp, &keys[i], path, sizeof path);
    if (status[i] == ECS_OK && unlink(path) != 0)
      status[i] = errno == ENOENT ? ECS_ENOTFOUND : ECS_EIO;
  }
  return ECS_OK;
}

static const char *disk_errmsg(void *hp) {
  return ((disk_h_t *)hp)->err;
}

static const char *disk_path(void *hp) {
  (void)hp;
  return "file";
}

const ecs__ec_ops_t ecs__ec_ops_disk = {
    .name = "disk",
    .open = disk_open,
    .close = disk_close,
    .put = disk_put,
    .get = disk_get,
    .exists = disk_exists,
    .remove = disk_remove,
    .errmsg = disk_errmsg,
    .path = disk_path,
};
