// common/config_auth.h — the $.auth and $.tls sections of the cluster config
// (the cluster secret, tenants, certificates), read strictly like every other section: each bad
// field is refused with its JSON path and the reason.
#pragma once

#include <nlohmann/json.hpp>

#include "kvmesh/config.h"
#include "kvmesh/status.h"

namespace kvmesh {

// Reads `j` (the value of "$.auth") into *a.
Status ReadAuth(const nlohmann::json& j, AuthConfig* a);
// Reads `j` (the value of "$.tls") into *t; each file must be readable now.
Status ReadTls(const nlohmann::json& j, TlsConfig* t);

}  // namespace kvmesh
