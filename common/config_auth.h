// common/config_auth.h — the $.auth section of the cluster config (the
// cluster secret, tenants), read strictly like every other section: each bad
// field is refused with its JSON path and the reason.
#pragma once

#include <nlohmann/json.hpp>

#include "kvmesh/config.h"
#include "kvmesh/status.h"

namespace kvmesh {

// Reads `j` (the value of "$.auth") into *a.
Status ReadAuth(const nlohmann::json& j, AuthConfig* a);

}  // namespace kvmesh
