/*
 * Prints, as JSON, the size of every public struct the Python binding
 * mirrors with ctypes (ec_connector/python/ecstore/_lib.py) and the offset
 * of each field, so that tests/python/test_abi.py fails when a header
 * changes without the binding.  Headers only: nothing is linked.
 */
#include <stddef.h>
#include <stdio.h>

#include "ecstore/ec_connector.h"
#include "ecstore/ecstore.h"
#include "ecstore/pool.h"

static int first_struct = 1;
static int first_field;

static void begin(const char *name, size_t size) {
  printf("%s\n  \"%s\": {\"size\": %zu, \"fields\": {", first_struct ? "{" : ",", name, size);
  first_struct = 0;
  first_field = 1;
}

static void field(const char *name, size_t off) {
  printf("%s\"%s\": %zu", first_field ? "" : ", ", name, off);
  first_field = 0;
}

static void end(void) {
  printf("}}");
}

#define BEGIN(T) begin(#T, sizeof(T))
#define F(T, f) field(#f, offsetof(T, f))

int main(void) {
  BEGIN(ecs_tensor_desc_t);
  F(ecs_tensor_desc_t, dtype), F(ecs_tensor_desc_t, ndim), F(ecs_tensor_desc_t, shape);
  end();
  BEGIN(ecs_key_t);
  F(ecs_key_t, data), F(ecs_key_t, len);
  end();
  BEGIN(ecs_tensor_t);
  F(ecs_tensor_t, data), F(ecs_tensor_t, nbytes), F(ecs_tensor_t, desc);
  end();
  BEGIN(ecs_get_buf_t);
  F(ecs_get_buf_t, data), F(ecs_get_buf_t, capacity), F(ecs_get_buf_t, status), F(ecs_get_buf_t, nbytes);
  F(ecs_get_buf_t, desc);
  end();
  BEGIN(ecs_view_t);
  F(ecs_view_t, data), F(ecs_view_t, nbytes), F(ecs_view_t, desc), F(ecs_view_t, status);
  F(ecs_view_t, lease_), F(ecs_view_t, map_), F(ecs_view_t, srv_);
  end();
  BEGIN(ecs_holder_t);
  F(ecs_holder_t, status), F(ecs_holder_t, node_id), F(ecs_holder_t, addr), F(ecs_holder_t, local);
  end();
  BEGIN(ecs_client_config_t);
  F(ecs_client_config_t, servers), F(ecs_client_config_t, redis_url), F(ecs_client_config_t, ns);
  F(ecs_client_config_t, auth_token), F(ecs_client_config_t, connect_timeout_ms);
  F(ecs_client_config_t, timeout_ms), F(ecs_client_config_t, verify_checksum);
  F(ecs_client_config_t, transport), F(ecs_client_config_t, rdma_device), F(ecs_client_config_t, rdma_port);
  F(ecs_client_config_t, rdma_gid_index), F(ecs_client_config_t, compression);
  F(ecs_client_config_t, shm_read_only), F(ecs_client_config_t, max_object_size);
  F(ecs_client_config_t, shm_server_uid), F(ecs_client_config_t, placement);
  F(ecs_client_config_t, registry_refresh_ms), F(ecs_client_config_t, replicas);
  end();
  BEGIN(ecs_server_stat_t);
  F(ecs_server_stat_t, pool_size), F(ecs_server_stat_t, pool_locked), F(ecs_server_stat_t, node_id);
  F(ecs_server_stat_t, address);
  end();
  BEGIN(ecs_server_stat_ext_t);
  F(ecs_server_stat_ext_t, pool_cuda_registered), F(ecs_server_stat_ext_t, reserved);
  end();
  BEGIN(ecs_ec_save_result_t);
  F(ecs_ec_save_result_t, mm_hash), F(ecs_ec_save_result_t, status);
  end();
  BEGIN(ecs_ec_load_item_t);
  F(ecs_ec_load_item_t, mm_hash), F(ecs_ec_load_item_t, dst), F(ecs_ec_load_item_t, capacity);
  F(ecs_ec_load_item_t, expected_nbytes);
  end();
  BEGIN(ecs_ec_load_result_t);
  F(ecs_ec_load_result_t, status), F(ecs_ec_load_result_t, nbytes), F(ecs_ec_load_result_t, desc);
  end();
  BEGIN(ecs_ec_stats_t);
  F(ecs_ec_stats_t, saves), F(ecs_ec_stats_t, has_errors), F(ecs_ec_stats_t, staging_in_use);
  end();
  BEGIN(ecs_pool_opts_t);
  F(ecs_pool_opts_t, size), F(ecs_pool_opts_t, min_block), F(ecs_pool_opts_t, huge), F(ecs_pool_opts_t, lock);
  F(ecs_pool_opts_t, cuda_register), F(ecs_pool_opts_t, name), F(ecs_pool_opts_t, on_populate);
  F(ecs_pool_opts_t, populate_ctx);
  end();
  BEGIN(ecs_pool_stats_t);
  F(ecs_pool_stats_t, size), F(ecs_pool_stats_t, alloc_failures), F(ecs_pool_stats_t, orders);
  F(ecs_pool_stats_t, free_count), F(ecs_pool_stats_t, locked), F(ecs_pool_stats_t, cuda_registered);
  end();
  printf("\n}\n");
  return 0;
}
