"""The network area: the VPC a stage creates, or the one it imports."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from stacks.settings.base import StrictModel


class VpcSettings(StrictModel):
    """Create a VPC (``cidr``, ``max_azs``) or import one from explicit ids (no lookups at synth time)."""

    # The subnets a created VPC gets in each of its max_azs zones (PlatformNetwork is given these): a private /20,
    # and, with NAT gateways, a public /24 that holds only them. AWS takes a VPC of /16 to /28 (VPC user guide,
    # "VPC CIDR blocks").
    PRIVATE_SUBNET_MASK: ClassVar[int] = 20
    PUBLIC_SUBNET_MASK: ClassVar[int] = 24
    LARGEST_PREFIX: ClassVar[int] = 16
    SMALLEST_PREFIX: ClassVar[int] = 28

    cidr: str = "10.40.0.0/16"
    max_azs: Annotated[int, Field(ge=1, le=3)] = 2
    nat_gateways: Annotated[int, Field(ge=0, le=4)] = 1
    flow_log_retention_days: Literal[7, 14, 30, 60, 90, 180, 365, 731] = 30
    vpc_id: str | None = None
    availability_zones: list[str] = Field(default=[])
    private_subnet_ids: list[str] = Field(default=[])

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        try:
            network = ipaddress.IPv4Network(value)
        except ValueError:
            raise ValueError("must be an IPv4 CIDR block such as 10.40.0.0/16") from None
        if not VpcSettings.LARGEST_PREFIX <= network.prefixlen <= VpcSettings.SMALLEST_PREFIX:
            raise ValueError(
                f"must have a prefix length from /{VpcSettings.LARGEST_PREFIX} to /{VpcSettings.SMALLEST_PREFIX}"
            )
        return value

    @field_validator("vpc_id")
    @classmethod
    def _vpc_id(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^vpc-[0-9a-f]{8,17}$", value):
            raise ValueError("must look like vpc-0123456789abcdef0")
        return value

    @model_validator(mode="after")
    def _import_is_complete(self) -> VpcSettings:
        if self.vpc_id is None and (self.private_subnet_ids or self.availability_zones):
            raise ValueError("private_subnet_ids and availability_zones are only allowed together with vpc_id")
        if self.vpc_id is not None:
            if not self.private_subnet_ids or len(self.private_subnet_ids) != len(self.availability_zones):
                raise ValueError("an imported VPC needs private_subnet_ids and one availability_zones entry per subnet")
            for subnet in self.private_subnet_ids:
                if not re.match(r"^subnet-[0-9a-f]{8,17}$", subnet):
                    raise ValueError(f"private_subnet_ids entry {subnet!r} must look like subnet-0123456789abcdef0")
        return self

    @property
    def imported(self) -> bool:
        return self.vpc_id is not None

    def subnet_masks(self) -> list[int]:
        """The masks of the subnets a created VPC gets, in the order ec2.Vpc allocates them (public ones first)."""
        public = [self.PUBLIC_SUBNET_MASK] * self.max_azs if self.nat_gateways else []
        return public + [self.PRIVATE_SUBNET_MASK] * self.max_azs

    def largest_prefix_for_subnets(self) -> int:
        """The longest prefix (smallest VPC) that holds ``subnet_masks``, placed as ec2.Vpc places them: one after
        another, each on a boundary of its own size (aws-cdk-lib's NetworkBuilder), so a /20 after /24s starts at
        the next /20 boundary."""
        end = 0
        for mask in self.subnet_masks():
            size = 2 ** (32 - mask)
            end = -(-end // size) * size + size
        return 32 - (end - 1).bit_length()
